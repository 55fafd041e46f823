"""The per-folder time table: which folder a node id counts for, and the table itself."""

from __future__ import annotations

import pytest

from tests.support.folder_times import folder_of


@pytest.mark.parametrize(
    ("nodeid", "folder"),
    [
        ("tests/sweep/test_e2e_sim.py::test_x", "sweep"),
        ("tests/load/web/test_ui.py::test_y[a/b]", "load"),
        ("tests/test_top.py::test_z", "."),
        ("sweep/test_e2e_sim.py::test_x", "sweep"),
    ],
)
def test_a_test_counts_for_its_first_folder(nodeid: str, folder: str) -> None:
    assert folder_of(nodeid) == folder


def test_the_table_sums_each_folder(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        **{
            "a/test_one.py": "import time\ndef test_a():\n    time.sleep(0.05)\n",
            "b/test_two.py": "def test_b():\n    pass\ndef test_c():\n    pass\n",
        }
    )
    pytester.makeconftest(
        "from tests.support.folder_times import FolderTimes\n"
        "def pytest_configure(config):\n"
        "    config.pluginmanager.register(FolderTimes(), 'times')\n"
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    result.stdout.re_match_lines(
        [r".*time per test folder.*", r"a\s+0\.\d s\s+1 tests", r"b\s+0\.\d s\s+2 tests"]
    )
