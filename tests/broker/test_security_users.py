"""Users: ``onceflow users`` offline (a stopped broker's data directory) and
over the wire (KIP-554), the credential file on disk (hashed, durable,
refused while a broker holds the directory), and confluent-kafka's
AdminClient managing SCRAM users that then log in."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from broker.broker import EmbeddedBroker
from broker.security.credentials import CredentialStore
from onceflow.cli import main

LISTENERS = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0"


def users(*argv, capsys) -> tuple[int, str, str]:
    code = main(["users", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def logs_in(broker, mechanism, username, password) -> bool:
    """Whether librdkafka authenticates on the SASL_PLAINTEXT listener (it
    fetches metadata only after logging in)."""
    import confluent_kafka.admin

    errors = []
    admin = confluent_kafka.admin.AdminClient(
        {
            "bootstrap.servers": broker.bootstrap_for("SASL_PLAINTEXT"),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": username,
            "sasl.password": password,
            "error_cb": errors.append,
        }
    )
    try:
        admin.list_topics(timeout=3)
        return True
    except confluent_kafka.KafkaException:
        return False


def test_users_added_offline_log_in_once_the_broker_starts(tmp_path, capsys):
    data_dir = str(tmp_path / "data")
    assert users("add", "alice", "--password", "a-pass", "--mechanism", "SCRAM-SHA-512", "--data-dir", data_dir, capsys=capsys)[0] == 0
    assert users("add", "bob", "--password", "b-pass", "--mechanism", "PLAIN", "--data-dir", data_dir, capsys=capsys)[0] == 0
    assert users("add", "bob", "--password", "b-pass2", "--data-dir", data_dir, capsys=capsys)[0] == 0
    code, out, _ = users("list", "--data-dir", data_dir, capsys=capsys)
    assert code == 0
    assert out.splitlines() == ["alice\tSCRAM-SHA-512(iterations=4096)", "bob\tPLAIN(iterations=4096),SCRAM-SHA-256(iterations=4096)"]
    with open(os.path.join(data_dir, "__cluster_metadata", "credentials.json"), encoding="utf-8") as handle:
        stored = handle.read()
    for password in ("a-pass", "b-pass", "b-pass2"):
        assert password not in stored  # hashed, never as typed
    with EmbeddedBroker(data_dir, properties={"listeners": LISTENERS}) as broker:
        assert logs_in(broker, "SCRAM-SHA-512", "alice", "a-pass")
        assert logs_in(broker, "PLAIN", "bob", "b-pass")
        assert logs_in(broker, "SCRAM-SHA-256", "bob", "b-pass2")
        assert not logs_in(broker, "SCRAM-SHA-256", "alice", "a-pass")  # no credential of that mechanism
        # While the broker holds the directory, offline changes are refused.
        code, _, err = users("add", "carol", "--password", "c", "--data-dir", data_dir, capsys=capsys)
        assert code == 1 and "is using" in err
    assert users("delete", "bob", "--mechanism", "PLAIN", "--data-dir", data_dir, capsys=capsys)[0] == 0
    code, _, err = users("delete", "nobody", "--data-dir", data_dir, capsys=capsys)
    assert code == 1 and "nobody" in err
    assert CredentialStore(data_dir).load().users() == {"alice": ("SCRAM-SHA-512",), "bob": ("SCRAM-SHA-256",)}


@pytest.mark.slow
def test_users_over_the_wire_take_effect_at_once(tmp_path, capsys):
    with EmbeddedBroker(str(tmp_path / "data"), properties={"listeners": LISTENERS}) as broker:
        wire = ("--bootstrap-server", broker.bootstrap)
        assert not logs_in(broker, "SCRAM-SHA-256", "dora", "d-pass")
        assert users("add", "dora", "--password", "d-pass", *wire, capsys=capsys)[0] == 0
        assert logs_in(broker, "SCRAM-SHA-256", "dora", "d-pass")
        assert users("add", "dora", "--password", "d-pass-512", "--mechanism", "SCRAM-SHA-512", "--iterations", "8192", *wire, capsys=capsys)[0] == 0
        code, out, _ = users("list", *wire, capsys=capsys)
        assert code == 0 and out.splitlines() == ["dora\tSCRAM-SHA-256(iterations=4096),SCRAM-SHA-512(iterations=8192)"]
        assert users("delete", "dora", "--mechanism", "SCRAM-SHA-256", *wire, capsys=capsys)[0] == 0
        assert not logs_in(broker, "SCRAM-SHA-256", "dora", "d-pass")
        assert logs_in(broker, "SCRAM-SHA-512", "dora", "d-pass-512")
        code, _, err = users("add", "erin", "--password", "e", "--mechanism", "PLAIN", *wire, capsys=capsys)
        assert code == 2 and "offline" in err
        code, _, err = users("add", "erin", "--password", "e", "--iterations", "100", *wire, capsys=capsys)
        assert code == 1 and "UNACCEPTABLE_CREDENTIAL" in err
        assert users("delete", "dora", *wire, capsys=capsys)[0] == 0
        code, _, err = users("delete", "dora", *wire, capsys=capsys)
        assert code == 1 and "RESOURCE_NOT_FOUND" in err
        # Through the SASL listener, logged in as a user made over the wire.
        assert users("add", "admin", "--password", "adm", "--mechanism", "SCRAM-SHA-512", *wire, capsys=capsys)[0] == 0
        secured = (
            "--bootstrap-server", broker.bootstrap_for("SASL_PLAINTEXT"), "--security-protocol", "SASL_PLAINTEXT",
            "--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", "admin", "--sasl-password", "adm",
        )
        assert users("add", "gail", "--password", "g", *secured, capsys=capsys)[0] == 0
        code, out, _ = users("list", *secured, capsys=capsys)
        assert code == 0 and [line.split("\t")[0] for line in out.splitlines()] == ["admin", "gail"]
        code, _, err = users("list", *secured[:-1], "not-adm", capsys=capsys)
        assert code == 1 and "Authentication failed" in err, err
        assert users("delete", "gail", *wire, capsys=capsys)[0] == 0
        assert users("delete", "admin", *wire, capsys=capsys)[0] == 0
    # What was changed over the wire was on disk.
    assert CredentialStore(str(tmp_path / "data")).load().users() == {}


@pytest.mark.slow
def test_confluent_kafka_admin_manages_scram_users(tmp_path):
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    with EmbeddedBroker(str(tmp_path / "data"), properties={"listeners": LISTENERS}) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        upsert = UserScramCredentialUpsertion("fred", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 10000), b"f-pass")
        for future in admin.alter_user_scram_credentials([upsert]).values():
            assert future.result(20) is None
        described = {user: future.result(20) for user, future in admin.describe_user_scram_credentials(["fred"]).items()}
        (info,) = described["fred"].scram_credential_infos
        assert (info.mechanism, info.iterations) == (ScramMechanism.SCRAM_SHA_512, 10000)
        assert logs_in(broker, "SCRAM-SHA-512", "fred", "f-pass")
        assert not logs_in(broker, "SCRAM-SHA-512", "fred", "wrong")
        for future in admin.alter_user_scram_credentials([UserScramCredentialDeletion("fred", ScramMechanism.SCRAM_SHA_512)]).values():
            assert future.result(20) is None
        assert not logs_in(broker, "SCRAM-SHA-512", "fred", "f-pass")
        with pytest.raises(Exception, match="RESOURCE_NOT_FOUND|nonexistent"):
            for future in admin.describe_user_scram_credentials(["fred"]).values():
                future.result(20)


def test_a_damaged_credential_file_is_refused(tmp_path):
    """A damaged credential file is refused with its name, never read as an
    empty store (which would lock every user out, or let a later write drop them)."""
    store = CredentialStore(str(tmp_path)).load()
    from broker.security.credentials import CredentialError, make

    store.upsert("gus", "SCRAM-SHA-256", make("SCRAM-SHA-256", "g"))
    with open(store.path, "r+b") as handle:
        handle.truncate(os.path.getsize(store.path) // 2)
    with pytest.raises(CredentialError, match="credentials.json"):
        CredentialStore(str(tmp_path)).load()


def test_the_users_command_is_listed():
    result = subprocess.run([sys.executable, "-m", "onceflow", "users", "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 and "add" in result.stdout and "list" in result.stdout


def test_weak_hashing_is_refused_offline(tmp_path, capsys):
    for mechanism in ("PLAIN", "SCRAM-SHA-256"):
        code, _, err = users("add", "hal", "--password", "h", "--mechanism", mechanism, "--iterations", "10", "--data-dir", str(tmp_path), capsys=capsys)
        assert code == 1 and "iterations" in err
    assert CredentialStore(str(tmp_path)).load().users() == {}


def test_the_credential_and_acl_files_are_readable_by_the_owner_only(tmp_path):
    from broker.security.acl_store import AclStore
    from broker.security.credentials import make
    from protocol.acls import AclBinding, AclOperation, ResourceType

    store = CredentialStore(str(tmp_path)).load()
    store.upsert("gus", "SCRAM-SHA-256", make("SCRAM-SHA-256", "g"))
    acls = AclStore(str(tmp_path))
    acls.save([AclBinding.of(ResourceType.TOPIC, "t", "User:gus", AclOperation.READ)])
    for path in (store.path, acls.path):
        assert os.stat(path).st_mode & 0o077 == 0, f"{path} is {oct(os.stat(path).st_mode & 0o777)}"
    # A file an earlier version left world-readable is tightened when loaded.
    os.chmod(store.path, 0o644)
    os.chmod(acls.path, 0o644)
    CredentialStore(str(tmp_path)).load()
    assert len(AclStore(str(tmp_path)).load()) == 1
    for path in (store.path, acls.path):
        assert os.stat(path).st_mode & 0o077 == 0, f"{path} is {oct(os.stat(path).st_mode & 0o777)}"


def test_a_write_that_fails_midway_keeps_the_old_credentials(tmp_path):
    from broker.security.credentials import make
    from storage.durable import DiskIO

    class TornDisk(DiskIO):
        def write(self, fd, data):
            os.write(fd, bytes(data[: len(data) // 2]))
            raise OSError(28, "No space left on device")

    CredentialStore(str(tmp_path)).load().upsert("gus", "SCRAM-SHA-256", make("SCRAM-SHA-256", "g"))
    store = CredentialStore(str(tmp_path), io=TornDisk()).load()
    with pytest.raises(OSError):
        store.upsert("hal", "SCRAM-SHA-256", make("SCRAM-SHA-256", "h"))
    assert store.users() == {"gus": ("SCRAM-SHA-256",)}  # written first, applied only then
    assert CredentialStore(str(tmp_path)).load().users() == {"gus": ("SCRAM-SHA-256",)}
    assert os.listdir(os.path.dirname(store.path)) == ["credentials.json"]


def test_one_alter_request_is_one_write_so_a_crash_cannot_split_a_users_changes(tmp_path):
    """AlterUserScramCredentials deleting alice's SCRAM-SHA-256 and adding her
    SCRAM-SHA-512 on a disk that fails every write after the first: the
    request is one write, so it lands whole (as two writes, the deletion
    landed, the upsertion failed, and she was left with neither)."""
    import asyncio

    from broker.security.credentials import make
    from broker.security.user_apis import UserScramApis
    from protocol import scram
    from storage.durable import DiskIO

    class FailsAfterFirstWrite(DiskIO):
        writes = 0

        def write(self, fd, data):
            FailsAfterFirstWrite.writes += 1
            if FailsAfterFirstWrite.writes > 1:
                raise OSError(5, "Input/output error")
            super().write(fd, data)

    CredentialStore(str(tmp_path)).load().upsert("alice", "SCRAM-SHA-256", make("SCRAM-SHA-256", "a"))
    store = CredentialStore(str(tmp_path), io=FailsAfterFirstWrite()).load()
    salt = os.urandom(16)
    salted = scram.salted_password(scram.SCRAM_SHA_512, b"a2", salt, 4096)
    body = {
        "deletions": [{"name": "alice", "mechanism": scram.SCRAM_SHA_256.kafka_type}],
        "upsertions": [{"name": "alice", "mechanism": scram.SCRAM_SHA_512.kafka_type, "iterations": 4096, "salt": salt, "salted_password": salted}],
    }
    answer = asyncio.run(UserScramApis(credentials=store).handle_alter(0, body))
    assert FailsAfterFirstWrite.writes == 1 and answer["results"][0]["error_code"] == 0
    assert CredentialStore(str(tmp_path)).load().users() == {"alice": ("SCRAM-SHA-512",)}


def test_a_credential_change_the_disk_refuses_is_answered_with_an_error_and_changes_nothing(tmp_path):
    import asyncio

    from broker.security.user_apis import UserScramApis
    from protocol import scram
    from protocol.errors import ErrorCode
    from storage.durable import DiskIO

    class FullDisk(DiskIO):
        def write(self, fd, data):
            raise OSError(28, "No space left on device")

    store = CredentialStore(str(tmp_path), io=FullDisk()).load()
    salt = os.urandom(16)
    upsertion = {"name": "alice", "mechanism": scram.SCRAM_SHA_256.kafka_type, "iterations": 4096, "salt": salt, "salted_password": salt}
    answer = asyncio.run(UserScramApis(credentials=store).handle_alter(0, {"deletions": [], "upsertions": [upsertion]}))
    assert answer["results"][0]["error_code"] == ErrorCode.UNKNOWN_SERVER_ERROR
    assert "No space left" in answer["results"][0]["error_message"]
    assert store.users() == {} and CredentialStore(str(tmp_path)).load().users() == {}
