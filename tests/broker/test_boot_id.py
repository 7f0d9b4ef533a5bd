"""The boot of the kernel a broker's data was last served in (``.boot_id``
in the data directory, ``ReplicaManager.same_boot``): the broker tells a
crash of its process alone (same boot: the page cache kept every byte)
from a stop of the machine (a new boot)."""

from __future__ import annotations

import os

from broker.broker import EmbeddedBroker, FaultSeams
from broker.replica import BOOT_ID_FILE, kernel_boot_id


def test_the_boot_id_is_recorded_and_compared_at_each_start(tmp_path):
    data = str(tmp_path / "data")
    with EmbeddedBroker(data) as broker:
        assert broker.broker.replicas.same_boot is False, "a new data directory has no boot recorded"
    with open(os.path.join(data, BOOT_ID_FILE), encoding="ascii") as file:
        assert file.read() == kernel_boot_id()
    with EmbeddedBroker(data) as broker:
        assert broker.broker.replicas.same_boot is True
    with EmbeddedBroker(data, seams=FaultSeams(boot_id="another-boot")) as broker:
        assert broker.broker.replicas.same_boot is False, "a start in another boot"
    with open(os.path.join(data, BOOT_ID_FILE), encoding="ascii") as file:
        assert file.read() == "another-boot", "the new boot is recorded for the next start"


def test_a_boot_id_that_cannot_be_recorded_does_not_stop_the_start(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / BOOT_ID_FILE).mkdir()  # not a file: neither read nor replaced
    with EmbeddedBroker(str(data)) as broker:
        assert broker.broker.replicas.same_boot is False
        assert broker.port > 0
