"""The README stays true (style B13, anti-pattern C8): its commands, defaults table, paper-to-code table and file map
are checked against the code, so a change that makes the README lie fails CI.

Run: pytest -q tests/test_readme.py
"""
import dataclasses
import importlib
import os
import re

from conftest import ROOT

README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def table_rows(heading):
    """Rows (lists of cell strings) of the first markdown table after the line starting with `heading`."""
    at = README.index(heading)
    rows = []
    for line in README[at:].splitlines()[1:]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not set("".join(cells)) <= set("-: "):       # skip the |---|---| separator
                rows.append(cells)
        elif rows:
            break
    return rows[1:]                                          # drop the header row


def test_two_commands_and_ci_runs_the_readme_test_command():
    main_cmd = "pip install -r requirements.txt && bash runs/mini.sh"
    test_cmd = "pip install -r requirements.txt && python -m pytest -q"
    assert main_cmd in README and test_cmd in README
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert test_cmd in ci, ".ci/run must run exactly the README's test command"
    assert README.index(main_cmd) < README.index(test_cmd)  # the main job is the first command


def test_defaults_table_matches_the_code():
    import model
    import optim
    import train
    defaults = {f.name: f.default for cls in (model.ModelConfig, train.TrainConfig) for f in dataclasses.fields(cls)}
    rows = table_rows("## Defaults")
    assert len(rows) >= 15
    checked = 0
    for setting, value, _where in rows:
        names = re.findall(r"`(\w+)`", setting)
        values = [v.strip() for v in value.split("/")]
        assert names and len(names) == len(values), f"malformed defaults row: {setting} | {value}"
        for name, shown in zip(names, values):
            actual = getattr(optim, name) if name.isupper() else defaults[name]
            if actual is None:
                assert shown.startswith("None"), f"{name}: README says {shown}, code says None"
            elif isinstance(actual, str):
                assert shown == actual, f"{name}: README says {shown}, code says {actual}"
            else:
                assert float(shown) == float(actual), f"{name}: README says {shown}, code says {actual}"
            checked += 1
    print(f"\n{checked} defaults checked against ModelConfig / TrainConfig / optim.py")


def test_paper_to_code_table_points_at_real_code():
    rows = table_rows("## Paper → code")
    assert len(rows) >= 20
    refs = [ref for _, code in rows for ref in re.findall(r"`([\w/]+\.(?:py|sh))(?::([\w.]+))?`", code)]
    for path, attr in refs:
        assert os.path.exists(os.path.join(ROOT, path)), f"README names {path}, which does not exist"
        if attr:
            obj = importlib.import_module(path[:-3])
            for part in attr.split("."):
                assert hasattr(obj, part), f"README names {path}:{attr}, which does not exist"
                obj = getattr(obj, part)
    print(f"\n{len(refs)} paper-to-code references resolve")


def test_file_map_lists_every_file_with_its_size():
    rows = table_rows("## Files")
    listed = {}
    for cells in rows:
        path = re.search(r"`([^`]+)`", cells[0]).group(1)
        listed[path] = int(cells[1].replace(",", "")) if cells[1].replace(",", "").isdigit() else None
    # every top-level Python file and every runs/ script or benchmark: a new file cannot hide from the map
    tracked = sorted(f for f in os.listdir(ROOT) if f.endswith(".py"))
    tracked += sorted("runs/" + f for f in os.listdir(os.path.join(ROOT, "runs")) if f.endswith((".sh", ".bash", ".py")))
    for path in tracked:
        assert path in listed, f"README file map misses {path}"
    for path, lines in listed.items():
        full = os.path.join(ROOT, path)
        assert os.path.exists(full), f"README file map lists {path}, which does not exist"
        if lines is not None and os.path.isfile(full):
            actual = sum(1 for _ in open(full, encoding="utf-8"))
            assert abs(actual - lines) <= max(10, 0.1 * actual), f"{path}: README says {lines} lines, it has {actual}"
