"""A table of bad inputs over every CLI command: each must exit with its code, print one line on
stderr without a traceback, echo no secret, and delete or overwrite nothing.
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from harness import (
    INPUTS,
    TOKENS,
    Result,
    Timer,
    changed,
    one_line_error,
    run_cli,
    snapshot,
    write_config,
)


@dataclass
class Case:
    """One bad input: the argv (with {placeholders}), the exit code and stderr fragments."""

    name: str
    args: list[str]
    code: int = 2
    fragments: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()  # must appear in no output (secrets)


class Evil:
    def __reduce__(self):  # unpickling would run a shell command
        return (os.system, ("echo pwned-by-a-checkpoint",))


@dataclass
class Fixtures:
    """Files the cases point at: a trained run, shards, configs and bad files."""

    root: Path
    paths: dict[str, str] = field(default_factory=dict)

    def config(self, name: str, **sections: dict) -> str:
        """Write a variant of the tiny config; return its path."""
        return str(write_config(self.root / "configs" / name, **sections))

    def raw(self, name: str, content: bytes | str) -> str:
        """Write a file with exactly this content; return its path."""
        path = self.root / "files" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        return str(path)


def build_fixtures(root: Path, quick: bool) -> Fixtures:
    """Write the configs and bad files every case may name (and, in full, a trained run)."""
    import torch

    f = Fixtures(root)
    p = f.paths
    p["cfg"] = f.config("good")
    p["blocker"] = f.raw("a-file", "a file where a folder should be")
    p["binary"] = f.raw("binary.bin", bytes(range(256)) * 4)
    p["evil"] = str(root / "files" / "evil.pt")
    torch.save({"model": Evil(), "config": {}}, p["evil"])
    p["evil_raw"] = f.raw("evil_raw.pt", pickle.dumps(Evil()))
    p["corrupt"] = f.raw("corrupt.pt", b"PK\x03\x04" + bytes(500))
    p["dict_ckpt"] = str(root / "files" / "dict.pt")
    torch.save({"weights": torch.zeros(2)}, p["dict_ckpt"])
    p["json_list"] = f.raw("metrics.jsonl", '[1, 2]\n{"step": 1, "loss": 2.0}\n')
    p["dataset_pickle"] = str(root / "files" / "dataset.pt")
    torch.save(Evil(), p["dataset_pickle"])
    p["list_yaml"] = f.raw("list.yaml", "- a\n- list\n")
    p["broken_yaml"] = f.raw("broken.yaml", "model: {n_layer: [\n")
    p["nul_yaml"] = f.raw("nul.yaml", 'run:\n  output_dir: "runs/\\0x"\n')
    p["overlay_list"] = f.raw("overlay.yaml", "- model.n_layer: 3\n")
    p["empty_dir"] = str(root / "files" / "empty-dir")
    Path(p["empty_dir"]).mkdir(parents=True, exist_ok=True)
    for key, sections in {
        "n_layer_huge": {"model": {"n_layer": 10**20}},
        "vocab_huge": {"model": {"vocab_size": 10**30}},
        "batch_huge": {"data": {"target_batch_size": 10**30}},
        "workers_huge": {"data": {"num_workers": 2147483648}},
        "blank_name": {"run": {"name": "  "}},
        "empty_output": {"run": {"output_dir": ""}},
        "n_head_zero": {"model": {"n_head": 0}},
        "too_big": {"model": {"n_layer": 60000, "d_model": 4096, "n_head": 32}},
        "unknown_model": {"model": {"name": "no_such_model"}},
        "missing_shards": {"data": {"shard_path": str(root / "nowhere" / "train_*.bin")}},
        "pickle_dataset": {"data": {"dataset": p["dataset_pickle"], "synthetic": False}},
        "repo_escape": {
            "distributed": {
                "enabled": True,
                "repo_id": "../../x",
                "transport": "filesystem",
                "endpoint": str(root / "shared"),
            }
        },
        "output_under_file": {"run": {"output_dir": str(Path(p["blocker"]) / "run")}},
        "checkpoints_under_file": {"checkpoint": {"directory": str(Path(p["blocker"]) / "ck")}},
        "metrics_under_file": {"logging": {"json_file": str(Path(p["blocker"]) / "m.jsonl")}},
        "unknown_key": {"model": {"n_layers": 3}},
    }.items():
        p[key] = f.config(key, **sections)
    bad_ids = root / "files" / "bad-shards"
    from speedtronic_data import write_shard

    write_shard(bad_ids / "train_000000.bin", [1, 2, 3] * 1000 + [200])  # 200 >= vocab 128
    p["bad_ids"] = f.config("bad_ids", data={"shard_path": str(bad_ids / "train_*.bin")})
    if not quick:
        _trained_run(f)
    return f


def _trained_run(f: Fixtures) -> None:
    """Train the tiny run 4 steps (checkpoints at 2 and 4) and copies with broken checkpoints."""
    run = f.root / "trained"
    config = write_config(run, checkpoint={"every_steps": 2, "keep_last": None})
    result = run_cli(["train", str(config), "--max-steps", "4"], f.root, label="corpus/fixture")
    if result.returncode != 0:
        raise RuntimeError(f"the corpus's fixture run failed: {result.stderr[-500:]}")
    f.paths["run_cfg"] = str(config)
    f.paths["ckpt"] = str(run / "run" / "checkpoints" / "step_4.pt")
    f.paths["bigger"] = f.config(
        "bigger", model={"d_model": 64}, run={"output_dir": str(run / "run")}
    )
    f.paths["adamw"] = f.config(
        "adamw", optimizer={"name": "adamw"}, run={"output_dir": str(run / "run")}
    )
    for name, damage in {"all_corrupt": b"garbage", "all_evil": None}.items():
        copy = f.root / name
        shutil.copytree(run, copy)
        INPUTS.add(copy / config.name)  # the copied input config holds the token on purpose
        for checkpoint in (copy / "run" / "checkpoints").glob("step_*.pt"):
            if damage is None:
                import torch

                torch.save({"model": Evil()}, checkpoint)
            else:
                checkpoint.write_bytes(damage)
        f.paths[f"{name}_cfg"] = f.config(name, run={"output_dir": str(copy / "run")})


# The fast subset the default tests run: one per command, mostly before torch is imported, and
# none needing the trained run.
QUICK = {
    "train: n_layer 1e20",
    "validate: missing",
    "validate: token as a number",
    "validate: token mapping",
    "validate: --set malformed YAML",
    "prepare: --stdlib-bytes -1",
    "plot: binary file",
    "plot: JSON lines that are not objects",
    "sample: malicious",
    "sample: --max-new-tokens -5",
    "export: --private without push",
}


def cases() -> list[Case]:
    """Return the corpus: #19's cases and the earlier probe's, over every command."""
    t = TOKENS["set"]
    cfg = "{cfg}"
    table = [
        # ---- train: the config file
        Case("train: config file missing", ["train", "{root}/nope.yaml"], 2, ("not found",)),
        Case("train: config is a folder", ["train", "{empty_dir}"], 2, ("is a directory",)),
        Case("train: config is binary", ["train", "{binary}"], 2, ("not UTF-8",)),
        Case("train: config is a list", ["train", "{list_yaml}"], 2, ("mapping",)),
        Case("train: config YAML broken", ["train", "{broken_yaml}"], 2, ("line",)),
        Case("train: NUL in output_dir", ["train", "{nul_yaml}"], 2, ("NUL",)),
        Case("train: unknown key", ["train", "{unknown_key}"], 2, ("did you mean n_layer",)),
        Case("train: n_head 0", ["train", "{n_head_zero}"], 2, ("model.n_head",)),
        Case("train: n_layer 1e20", ["train", "{n_layer_huge}"], 2, ("model.n_layer",)),
        Case("train: vocab_size 1e30", ["train", "{vocab_huge}"], 2, ("model.vocab_size",)),
        Case("train: target batch 1e30", ["train", "{batch_huge}"], 2, ("target_batch_size",)),
        Case("train: num_workers 2**31", ["train", "{workers_huge}"], 2, ("data.num_workers",)),
        Case("train: blank run.name", ["train", "{blank_name}"], 2, ("run.name",)),
        Case("train: empty output_dir", ["train", "{empty_output}"], 2, ("run.output_dir",)),
        Case("train: too big for memory", ["train", "{too_big}"], 2, ("needs at least",)),
        Case("train: unknown model name", ["train", "{unknown_model}"], 2, ("no_such_model",)),
        Case(
            "train: output under a file",
            ["train", "{output_under_file}"],
            2,
            ("run.output_dir: cannot write",),
        ),
        Case(
            "train: checkpoints under a file",
            ["train", "{checkpoints_under_file}"],
            2,
            ("checkpoint.directory: cannot write",),
        ),
        Case(
            "train: metrics under a file",
            ["train", "{metrics_under_file}"],
            2,
            ("logging.json_file: cannot write",),
        ),
        Case(
            "train: shard glob matches nothing",
            ["train", "{missing_shards}"],
            2,
            ("matches no files",),
        ),
        Case(
            "train: token id >= vocab_size in a shard",
            ["train", "{bad_ids}"],
            2,
            ("holds token id 200 >= vocab_size 128",),
        ),
        Case(
            "train: pickled data.dataset untrusted",
            ["train", "{pickle_dataset}"],
            2,
            ("trust_pickle",),
        ),
        Case(
            "train: repo_id escapes the endpoint",
            ["train", "{repo_escape}"],
            2,
            ("distributed.repo_id",),
        ),
        # ---- train: --set, --max-steps, --device, --cuda-overlay
        Case(
            "--set token as a number",
            ["train", cfg, "--set", "distributed.token=123456789012345"],
            2,
            ("value hidden",),
            ("123456789012345",),
        ),
        Case(
            "--set token starting with @",
            ["train", cfg, "--set", f"distributed.token=@{t}"],
            2,
            ("distributed.token",),
            (t,),
        ),
        Case(
            "--set token as a list",
            ["train", cfg, "--set", f"distributed.token=[{t}, x]"],
            2,
            ("value hidden",),
            (t,),
        ),
        Case(
            "--set token as a mapping",
            ["train", cfg, "--set", f"distributed.token={{a: {t}}}"],
            2,
            ("value hidden",),
            (t,),
        ),
        Case(
            "--set token with ':' for '='",
            ["train", cfg, "--set", f"distributed.token:{t}"],
            2,
            ("section.key=value",),
            (t,),
        ),
        Case(
            "--set malformed YAML",
            ["train", cfg, "--set", "run.name=[1,"],
            2,
            ("not valid YAML at line 1",),
        ),
        Case(
            "--set unknown key",
            ["train", cfg, "--set", "model.n_layr=3"],
            2,
            ("did you mean n_layer",),
        ),
        Case(
            "--set without =", ["train", cfg, "--set", "model.n_layer"], 2, ("section.key=value",)
        ),
        Case(
            "--set keep_last 0",
            ["train", cfg, "--set", "checkpoint.keep_last=0"],
            2,
            ("checkpoint.keep_last",),
        ),
        Case(
            "--set eval_every 0",
            ["train", cfg, "--set", "data.eval_every=0"],
            2,
            ("data.eval_every",),
        ),
        Case(
            "--set unknown hook",
            ["train", cfg, "--set", "logging.hooks=[mlflow]"],
            2,
            ("logging.hooks[0]",),
        ),
        Case(
            "--set optimizer sgd", ["train", cfg, "--set", "optimizer=sgd"], 2, ("optimizer.name",)
        ),
        Case(
            "--set precision fp8", ["train", cfg, "--set", "precision=fp8"], 2, ("precision.mode",)
        ),
        Case(
            "--set distributed without repo",
            ["train", cfg, "--set", "distributed.enabled=true"],
            2,
            ("distributed.repo_id",),
        ),
        Case(
            "--set blank shard_path",
            ["train", cfg, "--set", "data.shard_path=' '"],
            2,
            ("data.shard_path",),
        ),
        Case("--set negative seed", ["train", cfg, "--set", "run.seed=-1"], 2, ("run.seed",)),
        Case("--set NUL in name", ["train", cfg, "--set", 'run.name="a\\0b"'], 2, ("NUL",)),
        Case("--max-steps abc", ["train", cfg, "--max-steps", "abc"], 2, ("--max-steps",)),
        Case("--max-steps 0", ["train", cfg, "--max-steps", "0"], 2, ("max_steps",)),
        Case("--max-steps -1", ["train", cfg, "--max-steps", "-1"], 2, ("max_steps",)),
        Case("--device bogus", ["train", cfg, "--device", "bogus"], 2, ("bogus",)),
        Case("--device cuda:7 absent", ["train", cfg, "--device", "cuda:7"], 2, ("cuda",)),
        Case(
            "--cuda-overlay missing",
            ["train", cfg, "--cuda-overlay", "{root}/gone.yaml"],
            2,
            ("gone.yaml",),
        ),
        Case(
            "--cuda-overlay a list",
            ["train", cfg, "--cuda-overlay", "{overlay_list}"],
            2,
            ("mapping of dotted keys",),
        ),
        # ---- train --resume against a checkpoint that does not fit
        Case(
            "--resume with another model size",
            ["train", "{bigger}", "--resume"],
            2,
            ("was written with other model settings", "model.d_model: checkpoint 32, this run 64"),
        ),
        Case(
            "--resume with another optimizer",
            ["train", "{adamw}", "--resume"],
            2,
            ("optimizer.name: muon", "--set optimizer.name=muon"),
        ),
        Case(
            "--resume with every checkpoint corrupt",
            ["train", "{all_corrupt_cfg}", "--resume"],
            1,
            ("no loadable checkpoint",),
        ),
        Case(
            "--resume with malicious checkpoints",
            ["train", "{all_evil_cfg}", "--resume"],
            1,
            ("never contains",),
        ),
        # ---- validate
        Case("validate: missing", ["validate", "{root}/nope.yaml"], 2, ("not found",)),
        Case(
            "validate: n_layer 1e20 by --set",
            ["validate", cfg, "--set", "model.n_layer=1e20"],
            2,
            ("model.n_layer",),
        ),
        Case(
            "validate: token mapping",
            ["validate", cfg, "--set", f"distributed.token={{a: {t}}}"],
            2,
            ("value hidden",),
            (t,),
        ),
        Case(
            "validate: token as a number",
            ["validate", cfg, "--set", "distributed.token=123456789012345"],
            2,
            ("value hidden",),
            ("123456789012345",),
        ),
        Case(
            "validate: --set malformed YAML",
            ["validate", cfg, "--set", "run.name=[1,"],
            2,
            ("not valid YAML at line 1",),
        ),
        Case("validate: NUL in output_dir", ["validate", "{nul_yaml}"], 2, ("NUL",)),
        Case(
            "validate: repo_id ../../x",
            ["validate", cfg, "--set", "distributed.repo_id=../../x"],
            2,
            ("distributed.repo_id",),
        ),
        # ---- prepare
        Case(
            "prepare: missing input",
            ["prepare", "{root}/out-a", "{root}/missing.txt"],
            2,
            ("no such file",),
        ),
        Case(
            "prepare: --stdlib-bytes -1",
            ["prepare", "{root}/out-b", "--stdlib-bytes", "-1"],
            2,
            ("--stdlib-bytes",),
        ),
        Case(
            "prepare: --val-fraction 1.5",
            ["prepare", "{root}/out-c", "--val-fraction", "1.5"],
            2,
            ("--val-fraction: must be",),
        ),
        Case(
            "prepare: --tokenizer missing",
            ["prepare", "{root}/out-d", "--tokenizer", "{root}/tok.json"],
            2,
            ("tok.json",),
        ),
        Case("prepare: binary input", ["prepare", "{root}/out-e", "{binary}"], 2, ("UTF-8",)),
        Case(
            "prepare: output under a file",
            ["prepare", "{blocker}/out", "--stdlib-bytes", "2000"],
            2,
            ("a-file",),
        ),
        # ---- plot
        Case("plot: missing", ["plot", "{root}/nope"], 2, ("no such file",)),
        Case("plot: binary file", ["plot", "{binary}"], 2, ("not UTF-8",)),
        Case(
            "plot: JSON lines that are not objects",
            ["plot", "{json_list}"],
            2,
            ("not a record",),
        ),
        Case("plot: folder without metrics", ["plot", "{empty_dir}"], 2, ("no metrics.jsonl",)),
        Case(
            "plot: -o under a file",
            ["plot", "{ckpt_metrics}", "-o", "{blocker}/x.png"],
            2,
            ("a-file",),
        ),
        # ---- sample
        Case("sample: missing", ["sample", "{root}/nope.pt"], 2, ("no such checkpoint",)),
        Case("sample: corrupt", ["sample", "{corrupt}"], 2, ("corrupt",)),
        Case("sample: malicious", ["sample", "{evil}"], 2, ("never contains",)),
        Case("sample: raw malicious pickle", ["sample", "{evil_raw}"], 2, ("never contains",)),
        Case(
            "sample: a dict, not a checkpoint",
            ["sample", "{dict_ckpt}"],
            2,
            ("not a Speedtronic trainer checkpoint",),
        ),
        Case(
            "sample: a folder without checkpoints",
            ["sample", "{empty_dir}"],
            2,
            ("no step_<n>.pt or step_<n>.dcp checkpoint in", "pass a run's checkpoints folder"),
        ),
        Case(
            "sample: --max-new-tokens -5",
            ["sample", "{evil}", "--max-new-tokens", "-5"],  # refused before the file is read
            2,
            ("--max-new-tokens",),
        ),
        Case(
            "sample: --temperature -1",
            ["sample", "{ckpt}", "--temperature", "-1"],
            2,
            ("--temperature",),
        ),
        Case("sample: --top-k 0", ["sample", "{ckpt}", "--top-k", "0"], 2, ("--top-k",)),
        Case(
            "sample: --tokenizer missing",
            ["sample", "{ckpt}", "--tokenizer", "{root}/t.json"],
            2,
            ("t.json",),
        ),
        # ---- export
        Case(
            "export: missing",
            ["export", "{root}/nope.pt", "{root}/ex-a"],
            2,
            ("no such checkpoint",),
        ),
        Case("export: corrupt", ["export", "{corrupt}", "{root}/ex-b"], 2, ("corrupt",)),
        Case("export: malicious", ["export", "{evil}", "{root}/ex-c"], 2, ("never contains",)),
        Case(
            "export: --format onnx",
            ["export", "{ckpt}", "{root}/ex-d", "--format", "onnx"],
            2,
            ("--format",),
        ),
        Case(
            "export: --tokenizer without hf",
            ["export", "{ckpt}", "{root}/ex-e", "--tokenizer", "bytes"],
            2,
            ("--tokenizer needs --format hf",),
        ),
        Case(
            "export: --private without push",
            ["export", "{evil}", "{root}/ex-f", "--private"],  # refused before the file is read
            2,
            ("--push-to-hub",),
        ),
        Case(
            "export: --max-shard-size lots",
            ["export", "{ckpt}", "{root}/ex-g", "--format", "hf", "--max-shard-size", "lots"],
            2,
            ("--max-shard-size",),
        ),
        Case("export: output is a file", ["export", "{ckpt}", "{blocker}"], 2, ("a-file",)),
    ]
    return table


def _fill(arg: str, paths: dict[str, str]) -> str:
    """Replace each {name} of a fixture in arg (other braces, e.g. YAML mappings, stay)."""
    for key, value in paths.items():
        arg = arg.replace("{" + key + "}", value)
    return arg


def run(work: Path, quick: bool, rng: random.Random) -> Result:
    """Run every case (quick: the marked fast ones) against the fixtures."""
    result = Result("bad-input corpus", "every case: its exit code, one line, nothing touched")
    timer = Timer()
    fixtures = build_fixtures(work / "fixtures", quick)
    paths = {"root": str(work), **fixtures.paths}
    if "ckpt" in paths:  # the trained run exists in full mode only
        paths["ckpt_metrics"] = str(Path(paths["ckpt"]).parents[1] / "metrics.jsonl")
    chosen = [c for c in cases() if c.name in QUICK] if quick else cases()
    for case in chosen:
        before = snapshot(work / "fixtures")
        args = [_fill(arg, paths) for arg in case.args]
        proc = run_cli(args, work, label=f"corpus/{case.name}")
        problem = one_line_error(proc, case.code, *case.fragments)
        leaked = [s for s in case.absent if s in proc.stdout + proc.stderr]
        touched = changed(before)
        ok = problem is None and not leaked and not touched
        result.case(
            ok,
            case=case.name,
            exit=proc.returncode,
            stderr=proc.stderr.strip()[:400],
            problem=problem or (f"echoed {leaked}" if leaked else None) or (touched or None),
        )
    result.figures = {
        "cases": len(result.cases),
        "as_expected": sum(c["ok"] for c in result.cases),
        "commands": sorted({c.args[0] for c in chosen}),
    }
    result.seconds = timer.seconds
    return result
