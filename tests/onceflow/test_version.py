"""``onceflow --version`` reports the version pip installed, the one
pyproject.toml declares (and CHANGELOG.md names)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib

from tests.conftest import REPO

BIN = os.path.dirname(sys.executable)


def declared_version() -> str:
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as file:
        return tomllib.load(file)["project"]["version"]


def test_onceflow_version_prints_the_installed_version():
    for command in ([os.path.join(BIN, "onceflow"), "--version"], [sys.executable, "-m", "onceflow", "--version"]):
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO)
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"onceflow {declared_version()}\n"


def test_the_version_is_in_the_help_and_the_changelog():
    result = subprocess.run([os.path.join(BIN, "onceflow"), "--help"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert "--version" in result.stdout
    with open(os.path.join(REPO, "CHANGELOG.md"), encoding="utf-8") as file:
        headings = re.findall(r"^## \[([^\]]+)\]", file.read(), flags=re.M)
    assert headings[0] == "Unreleased" and declared_version() in headings, headings
