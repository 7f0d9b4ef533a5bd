"""``onceflow dump-log`` prints segments like DumpLogSegments and survives damage."""

import io
import subprocess
import sys

from protocol.records import ControlType, encode_batch, encode_control_batch
from storage.config import LogConfig
from storage.log import PartitionLog
from storage.dump_log import dump


def make_log(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), LogConfig(flush_policy="os", index_interval_bytes=100))
    for i in range(5):
        partition_log.append(encode_batch([(b"k%d" % i, b"value-%d" % i, [("h", b"1")], 1000 + i)], producer_id=9, producer_epoch=1, base_sequence=i, is_transactional=True))
    partition_log.append_control(encode_control_batch(ControlType.COMMIT, producer_id=9, producer_epoch=1, coordinator_epoch=2, timestamp=2000), coordinator_epoch=2)
    partition_log.close()
    return tmp_path / "00000000000000000000.log"


def test_dump_prints_every_field(tmp_path):
    path = make_log(tmp_path)
    out = io.StringIO()
    assert dump([str(path)], print_data_log=True, out=out) == 0
    text = out.getvalue()
    assert text.count("baseOffset:") == 6
    first = text.splitlines()[2]
    for field in ["baseOffset: 0", "lastOffset: 0", "count: 1", "producerId: 9", "producerEpoch: 1", "baseSequence: 0",
                  "isTransactional: true", "isControl: false", "position: 0", "CreateTime: 1000", "magic: 2",
                  "compresscodec: none", "crc:", "isvalid: true", "size:"]:
        assert field in first, field
    assert "endTxnMarker: COMMIT coordinatorEpoch: 2" in text
    assert "key: k0 payload: value-0" in text


def test_dump_reports_where_a_damaged_file_stops_being_valid(tmp_path):
    path = make_log(tmp_path)
    data = bytearray(path.read_bytes())
    data[150] ^= 0xFF
    path.write_bytes(bytes(data[:-10]))
    out = io.StringIO()
    assert dump([str(path)], out=out) == 1
    assert "isvalid: false" in out.getvalue() or "invalid bytes" in out.getvalue()


def test_dump_index_and_cli(tmp_path):
    path = make_log(tmp_path)
    result = subprocess.run([sys.executable, "-m", "onceflow", "dump-log", str(path), str(tmp_path / "00000000000000000000.index")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "baseOffset: 5" in result.stdout
    assert "offset:" in result.stdout and "position:" in result.stdout
    missing = subprocess.run([sys.executable, "-m", "onceflow", "dump-log", str(tmp_path / "nope.log")], capture_output=True, text=True)
    assert missing.returncode == 1 and "Cannot read" in missing.stdout
