"""`hexhelix ir` and the CLI's contract: the IR JSON (schema hexhelix.ir/1) round-trips on every
example cluster; bad input exits 2 with exactly one stderr line naming the file and the field (no
traceback); `--help` works on every registered subcommand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hexhelix.ir.cluster import load_cluster
from hexhelix.ir.document import IR_SCHEMA, IRDocument, build_ir
from hexhelix.ir.model import PRESETS, TrainingConfig

from hexhelix.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = sorted((ROOT / "examples" / "clusters").glob("*.yaml"))
GOOD_NODE = "{name: a, gpu: A100, count: 8}"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ----------------------------------------------------------------------------- IR export
@pytest.mark.parametrize("cluster", CLUSTERS, ids=lambda p: p.stem)
def test_ir_on_every_example_cluster_round_trips(cluster: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "ir.json"
    rc, _, err = run_cli(capsys, "ir", "--model", "llama2-7b", "--cluster", str(cluster), "-o", str(out))
    assert rc == 0, err
    data = json.loads(out.read_text())
    assert data["schema"] == IR_SCHEMA
    doc = IRDocument.load(out)
    expected = build_ir(load_cluster(cluster), PRESETS["llama2-7b"], TrainingConfig())
    assert doc == expected
    assert doc.to_json() == out.read_text()
    # the device graph is written for readers and agrees with the cluster
    c = doc.cluster
    assert len(data["device_graph"]["nodes"]) == c.num_gpus
    assert len(data["device_graph"]["edges"]) == c.num_gpus * (c.num_gpus - 1) // 2
    assert [g.tp for g in doc.layer_graphs] == [t for t in (1, 2, 4, 8) if t <= max(n.count for n in c.nodes)]


def test_ir_flags_select_tp_sp_and_training(capsys) -> None:
    rc, out, err = run_cli(capsys, "ir", "--model", "tiny", "--cluster", "small-mixed", "--tp", "2", "--tp", "4",
                           "--no-sp", "--seq-len", "128", "--global-batch", "8", "--micro-batch", "2",
                           "--recompute", "selective")
    assert rc == 0, err
    doc = IRDocument.from_dict(json.loads(out))
    assert [(g.tp, g.sequence_parallel, g.seq_len, g.micro_batch) for g in doc.layer_graphs] == [
        (2, False, 128, 2), (4, False, 128, 2)]
    assert doc.training == TrainingConfig(global_batch=8, micro_batch=2, seq_len=128, recompute="selective",
                                          sequence_parallel=False)
    rc, out, _ = run_cli(capsys, "ir", "--model", "tiny", "--cluster", "small-mixed", "--tp", "2", "--sp")
    assert rc == 0 and [len(g.forward) for g in IRDocument.from_dict(json.loads(out)).layer_graphs] == [14]


def test_ir_reads_a_hf_config(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8,
                               "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 1000}))
    rc, out, err = run_cli(capsys, "ir", "--model", str(cfg), "--cluster", "small-mixed", "--tp", "2")
    assert rc == 0, err
    assert IRDocument.from_dict(json.loads(out)).model.kv_heads == 2


def test_ir_document_load_rejects_other_schemas(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"schema": "hexhelix.plan/1"}))
    with pytest.raises(ValueError, match=r"expected schema 'hexhelix\.ir/1'"):
        IRDocument.load(p)


# ----------------------------------------------------------------------------- bad input
def write(tmp_path: Path, name: str, text: str | bytes) -> str:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(p)


BAD_CLUSTERS = [
    # (id, file name, contents, the field (or other words) the one line must name)
    ("unknown-gpu", "c.yaml", "nodes: [{name: a, gpu: B300-Imaginary, count: 8}]", "nodes[0].gpu"),
    ("negative-count", "c.yaml", "nodes: [{name: a, gpu: A100, count: -2}]", "nodes[0].count"),
    ("zero-count", "c.yaml", "nodes: [{name: a, gpu: A100, count: 0}]", "nodes[0].count"),
    ("fractional-count", "c.yaml", "nodes: [{name: a, gpu: A100, count: 2.5}]", "nodes[0].count"),
    ("string-count", "c.yaml", "nodes: [{name: a, gpu: A100, count: '8'}]", "nodes[0].count"),
    ("missing-nodes", "c.yaml", "name: x\ninter_GBps: 5\n", "nodes"),
    ("missing-gpu", "c.yaml", "nodes: [{name: a, count: 8}]", "nodes[0].gpu"),
    ("missing-count", "c.yaml", "nodes: [{name: a, gpu: A100}]", "nodes[0].count"),
    ("missing-inter", "c.yaml", f"nodes: [{GOOD_NODE}, {{name: b, gpu: T4, count: 4}}]", "inter_GBps"),
    ("unknown-top-key", "c.yaml", f"nodes: [{GOOD_NODE}]\ninter_gbps: 5\n", "inter_gbps"),
    ("unknown-node-key", "c.yaml", "nodes: [{name: a, gpu: A100, count: 8, cnt: 2}]", "nodes[0].cnt"),
    ("unreadable-yaml", "c.yaml", "nodes: [{name: a, gpu: A100\n  count: 8", "unreadable YAML at line"),
    ("tab-indented-yaml", "c.yaml", "nodes:\n\t- {name: a}\n", "unreadable YAML"),
    ("invalid-json", "c.json", '{"nodes": [}', "invalid JSON at line 1"),
    ("not-a-mapping", "c.yaml", "- just\n- a list\n", "expected a mapping"),
    ("empty-file", "c.yaml", "", "file is empty"),
    ("binary-file", "c.yaml", b"\xff\xfe\x00\x01garbage", "not a UTF-8 text file"),
    ("bad-link", "c.yaml", f"nodes: [{GOOD_NODE}]\nlinks: [{{between: [a, z], GBps: 1}}]", "links[0].between"),
    ("negative-bandwidth", "c.yaml", "nodes: [{name: a, gpu: A100, count: 8, intra_GBps: -3}]",
     "nodes[0].intra_GBps"),
    ("user-type-huge-memory", "c.yaml", "gpu_types: {X: {tflops: 10, memory_gib: 1.0e+308}}\nnodes: [{name: a, gpu: X, count: 1}]",
     "gpu_types.X.memory_gib"),
    ("huge-inter-bandwidth", "c.yaml", f"nodes: [{GOOD_NODE}]\ninter_GBps: 1.0e+300\n", "inter_GBps"),
    ("user-type-missing-memory", "c.yaml", "gpu_types: {X: {tflops: 10}}\nnodes: [{name: a, gpu: X, count: 1}]",
     "gpu_types.X.memory_gib"),
]


def assert_one_line_error(rc: int, err: str, *needles: str) -> None:
    assert rc == 2
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hexhelix ir: error: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize(("name", "contents", "needle"), [c[1:] for c in BAD_CLUSTERS], ids=[c[0] for c in BAD_CLUSTERS])
def test_bad_cluster_file_exits_2_with_one_line(tmp_path: Path, capsys, name: str, contents, needle: str) -> None:
    path = write(tmp_path, name, contents)
    rc, out, err = run_cli(capsys, "ir", "--model", "tiny", "--cluster", path)
    assert out == ""
    assert_one_line_error(rc, err, path, needle)


def test_missing_cluster_file(tmp_path: Path, capsys) -> None:
    missing = str(tmp_path / "nope.yaml")
    rc, _, err = run_cli(capsys, "ir", "--model", "tiny", "--cluster", missing)
    assert_one_line_error(rc, err, missing, "file not found")


def test_heads_not_divisible_by_tp(capsys) -> None:
    rc, _, err = run_cli(capsys, "ir", "--model", "llama2-7b", "--cluster", "small-mixed", "--tp", "3")
    assert_one_line_error(rc, err, "--tp", "heads=32", "not divisible by TP degree 3")
    rc, _, err = run_cli(capsys, "ir", "--model", "llama2-70b", "--cluster", "small-mixed", "--tp", "16")
    assert_one_line_error(rc, err, "--tp", "kv_heads=8")


@pytest.mark.parametrize("missing", ["hidden_size", "num_hidden_layers", "num_attention_heads",
                                     "intermediate_size", "vocab_size"])
def test_hf_config_missing_a_field(tmp_path: Path, capsys, missing: str) -> None:
    cfg = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8, "intermediate_size": 688,
           "vocab_size": 1000}
    del cfg[missing]
    path = write(tmp_path, "config.json", json.dumps(cfg))
    rc, _, err = run_cli(capsys, "ir", "--model", path, "--cluster", "small-mixed")
    assert_one_line_error(rc, err, f"{path}: {missing}: missing required field")


def test_bad_flags_name_the_flag(tmp_path: Path, capsys) -> None:
    rc, _, err = run_cli(capsys, "ir", "--model", "llama-9000", "--cluster", "small-mixed")
    assert_one_line_error(rc, err, "--model", "not a preset")
    rc, _, err = run_cli(capsys, "ir", "--model", "tiny", "--cluster", "small-mixed", "--global-batch", "3",
                         "--micro-batch", "2")
    assert_one_line_error(rc, err, "--global-batch", "not a multiple")
    rc, _, err = run_cli(capsys, "ir", "--model", "tiny", "--cluster", "small-mixed", "--seq-len", "0")
    assert_one_line_error(rc, err, "--seq-len")
    rc, _, err = run_cli(capsys, "ir", "--model", "tiny", "--cluster", "small-mixed", "--sp", "--no-sp")
    assert_one_line_error(rc, err, "--sp")
    target = str(tmp_path / "no-such-dir" / "ir.json")
    rc, _, err = run_cli(capsys, "ir", "--model", "tiny", "--cluster", "small-mixed", "-o", target)
    assert_one_line_error(rc, err, target, "cannot write")


def test_console_entry_point_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "c.yaml", "nodes: [{name: a, gpu: A100, count: -1}]")
    proc = subprocess.run([sys.executable, "-m", "hexhelix", "ir", "--model", "tiny", "--cluster", path],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"hexhelix ir: error: {path}: nodes[0].count: must be a positive "
                                        "integer, got -1"]


# ----------------------------------------------------------------------------- help
def test_top_level_help_lists_every_command(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_has_help(command: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: hexhelix " + command)


def test_gpus_lists_the_catalog(capsys) -> None:
    rc, out, _ = run_cli(capsys, "gpus", "--json")
    assert rc == 0 and json.loads(out)["RTX4090"]["source"]
    rc, out, _ = run_cli(capsys, "gpus")
    assert rc == 0 and "H200" in out


# `hexhelix demo` (the end-to-end tour) is tested in tests/test_demo.py.


@pytest.mark.parametrize("argv", [
    ["ir", "--model", "tiny", "--cluster", "small-mixed", "--global-batch", "abc"],
    ["ir", "--model", "tiny"],
    ["no-such-command"],
    ["ir", "--model", "tiny", "--cluster", "small-mixed", "--recompute", "most"],
])
def test_bad_flags_are_one_line_too(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "error: " in lines[0] and lines[0].endswith("--help)")


BROKEN_FILES = [
    # (id, contents (None: a folder), the words the one line must hold)
    ("binary", b"\xff\xfe\x00\x01garbage", "not a UTF-8 text file"),
    ("folder", None, "cannot read file"),
    ("empty", "", "file is empty"),
    ("bad-json", '{"stages": [}', "invalid JSON at line 1 column 13"),
]
FILE_READERS = [
    # (command, the arguments around the file: {f} is replaced by its path)
    ("evaluate", ["{f}"]),
    ("solve", ["{f}"]),
    ("compile", ["{f}"]),
    ("validate", ["{f}"]),
    ("show", ["{f}"]),
    ("simulate", ["{f}"]),
    ("pair", ["--model", "tiny", "--cluster", "small-mixed", "--tp", "2", "--plan", "{f}"]),
    ("plan", ["--model", "tiny", "--cluster", "small-mixed", "--solver", "megatron", "--profile", "{f}"]),
    ("plan", ["--model", "tiny", "--cluster", "{f}", "--solver", "megatron"]),
]


@pytest.mark.parametrize(("command", "args"), FILE_READERS, ids=[f"{c}-{a[-2] if len(a) > 1 else 'file'}" for c, a in FILE_READERS])
@pytest.mark.parametrize(("contents", "needle"), [b[1:] for b in BROKEN_FILES], ids=[b[0] for b in BROKEN_FILES])
def test_every_command_answers_a_broken_input_file_with_one_line_naming_it(tmp_path: Path, capsys, command: str,
                                                                           args: list[str], contents, needle: str) -> None:
    if contents is None:
        path = str(tmp_path / "a-folder.json")
        Path(path).mkdir()
    else:
        path = write(tmp_path, "broken.json", contents)
    rc, out, err = run_cli(capsys, command, *(a.replace("{f}", path) for a in args))
    assert rc == 2 and out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"hexhelix {command}: error: {path}: ") and needle in lines[0], lines[0]
