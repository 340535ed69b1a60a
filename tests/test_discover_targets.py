import json

import pytest

from rocforge_build.cli import main
from rocforge_build.discover import targets
from rocforge_build.errors import UsageError

# Values from amdkfd kfd_device.c (brief section 2).
KFD_VALUES = {
    "gfx90c": 90012, "gfx90a": 90010, "gfx942": 90402, "gfx1030": 100300, "gfx1031": 100301,
    "gfx1032": 100302, "gfx1035": 100305, "gfx1036": 100306, "gfx1100": 110000,
    "gfx1101": 110001, "gfx1102": 110002, "gfx1103": 110003, "gfx1150": 110500,
    "gfx1151": 110501, "gfx1152": 110502, "gfx1200": 120000, "gfx1201": 120001,
}


@pytest.mark.parametrize("name,version", sorted(KFD_VALUES.items()))
def test_kfd_encoding_round_trips(name, version):
    assert targets.gfx_name(version) == name
    assert targets.gfx_version(name) == version
    assert targets.get_target(name).gfx_target_version == version


def test_every_brief_target_is_in_the_table():
    assert set(KFD_VALUES) <= {t.name for t in targets.all_targets()}


@pytest.mark.parametrize(
    "name,override",
    [("gfx1031", "10.3.0"), ("gfx1032", "10.3.0"), ("gfx1036", "10.3.0"), ("gfx1101", "11.0.0"),
     ("gfx1103", "11.0.0"), ("gfx1151", "11.0.0"), ("gfx90c", "9.0.0")],
)
def test_community_override_values(name, override):
    t = targets.get_target(name)
    assert targets.get_target(t.override_with).hsa_version == override


def test_families_current_and_legacy():
    assert targets.get_target("gfx1100").therock_groups == ("gfx1100", "gfx110X-all", "gfx110X-dgpu")
    assert targets.get_target("gfx1151").therock_groups == ("gfx1151", "gfx115X-all")
    assert {t.name for t in targets.family_members("gfx110X-dgpu")} == {
        "gfx1100", "gfx1101", "gfx1102", "gfx1103"}
    assert {t.name for t in targets.family_members("gfx90X-dcgpu")} == {"gfx906", "gfx908", "gfx90a"}


def test_wave_sizes():
    assert targets.get_target("gfx942").wave_size == 64
    assert targets.get_target("gfx1151").wave_size == 32


def test_unknown_target_suggests_close_names():
    with pytest.raises(UsageError) as info:
        targets.get_target("gfx1115")
    assert "gfx1151" in info.value.hint


def test_cli_json(capsys):
    assert main(["targets", "--json", "gfx1151"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["override_value"] == "11.0.0"
    assert data[0]["peak_bandwidth_gbs"] == 256


def test_cli_unknown_target_is_one_clear_line(capsys):
    assert main(["targets", "gfx9999"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rocforge: error: unknown GPU target 'gfx9999'")
    assert "Traceback" not in err


def test_cli_table_reads_through_a_pipe_at_80_columns():
    """The newcomer trial: through a pipe names were cut to `gfx11…` and the table ran to 203
    lines.  Now one line per target, names whole; the fixed columns take at most 50 characters
    (the example product, last, is the only column cut, and only on a terminal)."""
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "rocforge_build", "targets"], capture_output=True,
                         text=True, check=True, env={**os.environ, "COLUMNS": "80"}).stdout
    lines = out.splitlines()
    names = [t.name for t in targets.all_targets()]
    assert len(lines) == len(names) + 2            # header, one per target, the --wide hint
    body = {line.split()[0]: line for line in lines[1:-1]}
    assert list(body) == names                     # every name whole, in order
    assert body["gfx1151"].split()[1:5] == ["11.5.1", "igpu", "32", "gfx1100"]
    assert lines[0].index("example product") <= 50   # leaves 30 columns for the product at 80
    wide = subprocess.run([sys.executable, "-m", "rocforge_build", "targets", "--wide", "gfx1151"],
                          capture_output=True, text=True, check=True).stdout
    assert "gfx115X-all" in wide and "59.4" in wide and "Radeon 8060S" in wide
