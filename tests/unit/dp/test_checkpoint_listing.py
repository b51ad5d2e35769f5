"""dp/checkpoint_meta.py's read_listing: a listing file read whole, within its limit, as strict JSON; each
refusal names the checkpoint and the listing file."""
import pytest

from parasim.dp.checkpoint_meta import Fields, read_listing
from parasim.errors import UsageError


def test_a_listing_is_read_as_strict_json_and_refusals_name_the_file(tmp_path):
    f = Fields(tmp_path, "metadata.json")
    path = tmp_path / "metadata.json"
    path.write_text('{"a": [1, 2]}')
    assert read_listing(path, f) == {"a": [1, 2]}
    with pytest.raises(UsageError, match=rf"^cannot read checkpoint file {tmp_path / 'none.json'}: "):
        read_listing(tmp_path / "none.json", f)
    with pytest.raises(UsageError, match=rf"^checkpoint file {path}: bytes: 13 is more than the limit of 12"):
        read_listing(path, f, limit=12)
    path.write_text('{"a": 1, "a": 2}')
    with pytest.raises(UsageError, match=rf"^checkpoint {tmp_path}: metadata.json is not a checkpoint's listing: "):
        read_listing(path, f)
