"""What a finished run leaves behind, used again: sampling text, exporting to safetensors or to a
Hugging Face `transformers` folder.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from speedtronic.corpus import tokenizer_file
from speedtronic.errors import UsageError

PathLike = str | os.PathLike[str]


def resolve_checkpoint(path: PathLike) -> Path:
    """Return the checkpoint `path` names: a step checkpoint itself, or the one a `latest` pointer,
    a checkpoints folder or a run folder holding `checkpoints/` leads to (as `train --resume` finds
    it); UsageError when there is none.
    """
    from speedtronic_trainer import CheckpointManager
    from speedtronic_trainer.checkpoint import LATEST_POINTER

    path = Path(path)
    if path.name == LATEST_POINTER and path.is_file():
        folder = path.parent
    elif path.is_dir() and path.suffix != ".dcp":
        folder = path
    else:
        return path
    latest = CheckpointManager(folder).latest_path()
    if latest is None and (path / "checkpoints").is_dir():  # a run's output_dir, as plot takes
        folder = path / "checkpoints"
        latest = CheckpointManager(folder).latest_path()
    if latest is None:
        raise UsageError(
            f"{path}: no step_<n>.pt or step_<n>.dcp checkpoint in {folder}; pass a run's "
            "checkpoints folder, its latest file or one of its step checkpoints"
        )
    return latest


def _missing_checkpoint(path: Path) -> UsageError:
    """Return the error for a checkpoint path that does not exist, naming the step checkpoints its
    folder does hold (a pruned step is then plain to see).
    """
    if not path.parent.is_dir():
        return UsageError(
            f"{path}: no such checkpoint (look in <output_dir>/checkpoints: latest, step_<n>.pt "
            "or .dcp)"
        )
    steps = _step_checkpoints(path.parent)
    held = f"has {', '.join(steps)}" if steps else "has no step checkpoints"
    return UsageError(f"{path}: no such checkpoint; {path.parent} {held}")


def _step_checkpoints(folder: Path, *, besides: Path | None = None) -> list[str]:
    """Return the names of the step checkpoints in folder, but `besides`."""
    from speedtronic_trainer import CheckpointManager

    return [p.name for p in CheckpointManager(folder).checkpoint_paths() if p != besides]


def read_checkpoint(path: PathLike) -> dict[str, Any]:
    """Return a trainer checkpoint's state (weights only): a step_<n>.pt file, the trainer state
    of a sharded step_<n>.dcp folder, or the checkpoint a `latest` pointer or a checkpoints folder
    leads to; UsageError when it is none of these.
    """
    path = Path(path)
    if not path.exists():
        raise _missing_checkpoint(path)
    path = resolve_checkpoint(path)
    from speedtronic_trainer import CheckpointError, CheckpointManager
    from speedtronic_trainer.checkpoint_checks import load_checkpoint_file

    try:
        if path.suffix == ".dcp":
            state = CheckpointManager(path.parent).load(path)
        else:
            state = load_checkpoint_file(path, hint="pass a step_<n>.pt a Speedtronic run wrote")
    except CheckpointError as error:
        # A run folder or `latest` leads to the newest: an older one beside it may be whole.
        others = _step_checkpoints(path.parent, besides=path)
        offer = f"; {path.parent} also has {', '.join(others)}, which you can pass instead"
        raise UsageError(f"{error}{offer if others else ''}") from None
    if "config" not in state or ("model" not in state and "sharded" not in state):
        raise UsageError(f"{path}: not a Speedtronic trainer checkpoint (no model/config entries)")
    return state


def _misfit_error(
    problems: list[str],
    model: Any,
    weights: Mapping[str, Any],
    state: dict[str, Any],
    name: str,
    path: PathLike,
) -> UsageError:
    """Return the UsageError naming why a checkpoint's `weights` do not load into `model`, the
    model.name `name` rebuilt from its config: another model's weights, no recorded config, or
    another size (or a damaged file).
    """
    from speedtronic_systems.parallel import model_class_name
    from speedtronic_trainer.checkpoint_checks import describe_misfits

    ours = model.state_dict().keys()
    foreign = [key for key in weights if key not in ours]
    held = state.get("model_class")  # None: written by 2.0, which recorded no class
    if held is not None and held != model_class_name(model):
        other = f"a {held}"
    elif held is None and foreign and sum(key in weights for key in ours) * 2 <= len(ours):
        other = "another model"
    else:
        other = None
    if other is not None:
        # A model the user passed to Trainer(model=...) (a transformers model, say): no model
        # setting rebuilds it, so naming a size mismatch would send the user the wrong way.
        found = (
            f"such as {foreign[0]}; {len(foreign)} of its {len(weights)} are not {name}'s"
            if foreign
            else describe_misfits(problems)
        )
        load = (
            "speedtronic_trainer.sharded.load_sharded(Path(PATH), model, None)"
            if "sharded" in state
            else "model.load_state_dict(checkpoint['model']) after checkpoint = torch.load(PATH)"
        )
        return UsageError(
            f"{path}: the checkpoint holds the weights of {other}, not of model.name {name} "
            f"({found}): sample and export rebuild model.name, not a model passed to "
            f"Trainer(model=...); load them into that model ({load}) and use its own tools "
            "(transformers: save_pretrained, generate)"
        )
    if state["config"] is None:  # a Trainer built without config= records none
        return UsageError(
            f"{path}: the checkpoint records no config (its Trainer was built without "
            f"config=), and the default model does not take its weights "
            f"({describe_misfits(problems)}); pass config= to the Trainer that writes it, or "
            "load its 'model' entry into your model yourself"
        )
    return UsageError(
        f"{path}: the weights do not fit the model its config describes "
        f"({describe_misfits(problems)})"
    )


def _model_from_state(state: dict[str, Any], path: PathLike) -> tuple[Any, Any]:
    import torch

    from speedtronic_config import SpeedtronicConfig
    from speedtronic_model import build_model
    from speedtronic_trainer import CheckpointError
    from speedtronic_trainer.checkpoint_checks import weight_misfits
    from speedtronic_trainer.sharded import load_sharded, sharded_model_weights

    config = SpeedtronicConfig.from_dict(state["config"])
    # The initial weights are replaced by the checkpoint's: drawing them leaves the caller's RNG be.
    with torch.random.fork_rng(devices=[]):
        model = build_model(config.model)  # model.init_from is not applied: the checkpoint's are
    try:
        # FSDP shards are checked by the names and shapes their .metadata records.
        sharded = Path(state["sharded"]) if "sharded" in state else None
        weights = state["model"] if sharded is None else sharded_model_weights(sharded)
        problems = weight_misfits(model, weights)
        if problems:
            raise _misfit_error(problems, model, weights, state, config.model.name, path)
        if sharded is None:
            model.load_state_dict(weights)
        else:  # gathered into this one process
            load_sharded(sharded, model, None)
    except CheckpointError as error:  # damaged shards, as read_checkpoint reports a bad file
        raise UsageError(str(error)) from None
    return model.eval(), config


def load_checkpoint_model(path: PathLike) -> tuple[Any, Any]:
    """Return (model in eval mode, its SpeedtronicConfig) rebuilt from a trainer checkpoint."""
    return _model_from_state(read_checkpoint(path), path)


def resolve_tokenizer(
    config: Any,
    choice: PathLike | None = None,
    *,
    strict: bool = True,
    recorded: Mapping[str, Any] | None = None,
    checkpoint: PathLike | None = None,
) -> Any:
    """Return the tokenizer a run used: `choice` (bytes or a tokenizer.json path) when given, else
    the one recorded beside its shards. `recorded`, the tokenizer a checkpoint records it trained
    with, must match it: a `choice` that does not is a UsageError; shards that cannot be found or
    hold another tokenizer are a UsageError when strict, else the byte tokenizer with a note on
    stderr. A checkpoint trained on bytes needs no shards. A relative shard glob that matches
    nothing here is also tried from each folder above `checkpoint` (the run started in one).
    """
    from speedtronic_config.tokenizer_identity import describe_apart
    from speedtronic_data import CharTokenizer, DataError, load_tokenizer
    from speedtronic_data.tokenizer_record import record_for, record_from_identity

    expected = record_from_identity(recorded) if recorded is not None else None
    if choice is not None:
        codec = _chosen_tokenizer(choice)
        given = record_for(codec)
        if expected is not None and not _is_recorded(
            codec, given, expected, config.data, checkpoint
        ):
            # Two tokenizer.json files of one size read alike: name each sha256 and say why.
            this, recorded_one = describe_apart(given.identity(), expected.identity())
            other = (
                " (another file; with the run's data, which holds its copy, not at hand, only the "
                "sha256 the checkpoint records can be compared)"
                if given.describe() == expected.describe()
                else ""
            )
            raise UsageError(
                f"--tokenizer {choice} is {this}, but the checkpoint was trained with "
                f"{recorded_one}{other}; pass that one, or omit --tokenizer"
            )
        return codec
    if expected is not None and expected.kind == "bytes":
        return CharTokenizer()
    hint = (  # a recorded tokenizer (not bytes: returned above) refuses any other
        "pass --tokenizer bytes or --tokenizer PATH/tokenizer.json"
        if expected is None
        else f"pass {expected.describe()}, which the checkpoint records, with --tokenizer PATH"
    )
    try:
        found = _shards_tokenizer(config.data, expected, checkpoint)
        if expected is None or found.encodes_alike(expected):
            return load_tokenizer(found)
        problem = (
            f"the tokenizer beside the run's data ({found.folder}) is {found.describe()}, but the "
            f"checkpoint was trained with {expected.describe()}"
        )
        hint = "pass that one with --tokenizer PATH/tokenizer.json"
    except DataError as error:
        problem = f"cannot tell which tokenizer the run used ({error})"
    if strict:
        raise UsageError(f"{problem}; {hint}")
    print(f"note: decoding with the byte tokenizer: {problem}; {hint}", file=sys.stderr)
    return CharTokenizer()


def _is_recorded(
    codec: Any, given: Any, expected: Any, data: Any, checkpoint: PathLike | None
) -> bool:
    """Return True when a --tokenizer choice (codec, its record `given`) maps text to the ids of
    the tokenizer a checkpoint records (`expected`): the same file, or one that behaves alike it
    (see behaves_alike) where it is at hand, as bytes or as the copy beside the run's shards. So
    a byte-level tokenizer.json (an export's) passes for bytes, and the run's tokenizer.json saved
    again by transformers (other bytes, the same ids) passes while the run's data is there.
    """
    from speedtronic_data import DataError
    from speedtronic_data.tokenizer_record import behaves_alike

    if given.encodes_alike(expected):
        return True
    try:
        reference = expected if expected.at_hand else _shards_tokenizer(data, expected, checkpoint)
        # a folder prepared again with another tokenizer is no reference
        return reference.encodes_alike(expected) and behaves_alike(codec, reference)
    except DataError:  # the run's data moved: only the recorded sha256 could tell
        return False


def _shards_tokenizer(data: Any, expected: Any, checkpoint: PathLike | None) -> Any:
    """Return the record beside the run's training shards; when a relative data.shard_path
    matches nothing from here, the first folder above `checkpoint` where it matches shards of the
    `expected` tokenizer (only a recorded identity makes such a find safe to use).
    """
    import dataclasses

    from speedtronic_data import DataError, run_tokenizer

    try:
        return run_tokenizer(data)
    except DataError:
        pattern = data.shard_path
        if expected is None or checkpoint is None or pattern is None or Path(pattern).is_absolute():
            raise
        for folder in Path(checkpoint).resolve().parents:
            moved = dataclasses.replace(data, shard_path=str(folder / pattern))
            try:
                found = run_tokenizer(moved)
            except DataError:
                continue
            if found.encodes_alike(expected):
                return found
        raise


def _chosen_tokenizer(choice: PathLike) -> Any:
    """Return the tokenizer --tokenizer names: bytes, or a tokenizer.json file or its folder."""
    from speedtronic_data import CharTokenizer, JsonTokenizer

    if str(choice) == "bytes":
        return CharTokenizer()
    return JsonTokenizer.from_file(tokenizer_file(choice))


def _check_fits(codec: Any, config: Any, choice: PathLike | None, *, export: bool = False) -> Any:
    """Return the tokenizer's record; UsageError when it has more ids than the model's vocabulary,
    which a trained checkpoint cannot grow. Only sample lets the byte tokenizer exceed a cut
    vocabulary, as it refuses a prompt byte past it: an export would pair the model with a
    tokenizer that hands transformers ids past its embedding (an IndexError on such text).
    """
    from speedtronic_data.tokenizer_record import record_for

    record = record_for(codec)
    ours, theirs = config.model.vocab_size, record.vocab_size
    if theirs is None or theirs <= ours or (record.kind == "bytes" and not export):
        return record
    if record.kind == "bytes":  # every byte needs its id: only a larger model takes them all
        raise UsageError(
            f"the byte tokenizer has {theirs} ids but the model only {ours:,} (model.vocab_size), "
            f"so transformers would look bytes from {ours} up past its embedding; train with "
            "model.vocab_size of at least 256, or export the weights alone (--format speedtronic)"
        )
    fix = "omit --tokenizer" if choice is not None else "pass it with --tokenizer"
    raise UsageError(
        f"the tokenizer has {theirs:,} ids but the model only {ours:,} (model.vocab_size); "
        f"use the tokenizer the run trained with ({fix})"
    )


def sample_text(
    path: PathLike,
    prompt: str,
    *,
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int | None = None,
    seed: int = 0,
    tokenizer: PathLike | None = None,
    on_text: Callable[[str], None] | None = None,
) -> str:
    """Return the prompt continued by the checkpoint's model, in the run's tokenizer (or
    `tokenizer`: bytes or a tokenizer.json). on_text, when given, is called with each new piece of
    that text as it is generated, the prompt first (TextStream); the pieces join to the returned
    text, all of it at the end for a model whose generate() takes no streamer=. A tokenizer whose
    decoder rewrites text already handed on (WordPiece's clean-up) can hand on less.
    """
    import torch

    state = read_checkpoint(path)
    model, config = _model_from_state(state, path)
    unusable = _unusable_generate(model)
    if unusable is not None:
        raise UsageError(
            f"{path}: model {config.model.name!r} has {unusable}; sample needs one taking "
            "(input_ids, max_new_tokens, temperature=, top_k=), as the reference model has"
        )
    codec = resolve_tokenizer(
        config, tokenizer, strict=False, recorded=state.get("tokenizer"), checkpoint=path
    )
    _check_fits(codec, config, tokenizer)
    prompt = prompt or "\n"
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as error:  # bytes the shell passed that are not UTF-8 (\udcff)
        raise UsageError(
            f"--prompt: not UTF-8 text (position {error.start} of {ascii(prompt)}); pass the "
            "prompt as UTF-8"
        ) from None
    prompt_ids = codec.encode(prompt)
    if not prompt_ids:  # a tokenizer without byte fallback drops what it does not know
        raise UsageError(
            f"--prompt {ascii(prompt)}: the run's tokenizer maps it to no tokens (it has none "
            "for those characters); use text it knows, e.g. --prompt 'def '"
        )
    vocab = config.model.vocab_size
    if max(prompt_ids, default=0) >= vocab:  # a byte past a cut vocabulary, e.g. "é" with 128 ids
        raise UsageError(
            f"--prompt: token id {max(prompt_ids)} is past the model's {vocab:,} ids "
            "(model.vocab_size, fixed by training); use only text the run's tokenizer maps below it"
        )
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    # The export's generation_config names this eos, and transformers' generate stops there.
    options: dict[str, Any] = _eos_token_id(codec, model)
    stream = None
    if on_text is not None and _takes(model.generate, "streamer"):
        from speedtronic.text_stream import TextStream

        stream = TextStream(codec, prompt_ids, on_text)
        options["streamer"] = stream
    with torch.no_grad():
        out = _seeded_generate(
            model, seed, ids, max_new_tokens, temperature=temperature, top_k=top_k, **options
        )
    text = codec.decode(out[0].tolist())
    if stream is not None:
        stream.close(text)
    elif on_text is not None:
        on_text(text)
    return text


def _unusable_generate(model: Any) -> str | None:
    """Return what keeps sample from calling the model's generate() (a custom model's), else
    None: checked before generating, as a TypeError inside it would be a runtime failure.
    """
    import inspect

    generate = getattr(model, "generate", None)
    if generate is None:
        return "no generate()"
    try:
        signature = inspect.signature(generate)
    except (TypeError, ValueError):  # no signature to read (a builtin): the call will tell
        return None
    try:  # partial: generator= and eos_token_id= are passed only where it takes them
        signature.bind_partial(None, 1, temperature=1.0, top_k=None)
    except TypeError:
        return f"a generate{signature} that sample cannot call"
    return None


def _seeded_generate(model: Any, seed: int, *args: Any, **kwargs: Any) -> Any:
    """Return model.generate(*args, **kwargs) sampling from torch's CPU generator seeded with seed,
    leaving the caller's global RNG state as it was: through generate's own generator= where it
    takes one (the reference model's), else with the default generator forked around the call.
    """
    import torch

    # A fresh generator seeded with seed draws what the default one did after manual_seed(seed):
    # the same seed gives the same text as before.
    if _takes(model.generate, "generator"):
        return model.generate(*args, generator=torch.Generator().manual_seed(seed), **kwargs)
    with torch.random.fork_rng(devices=[]):  # the model is on the CPU (_model_from_state)
        torch.default_generator.manual_seed(seed)
        return model.generate(*args, **kwargs)


def _takes(function: Any, name: str) -> bool:
    """Return whether function has a parameter called name."""
    import inspect

    return name in inspect.signature(function).parameters


def _eos_token_id(codec: Any, model: Any) -> dict[str, int]:
    """Return {"eos_token_id": id} for a tokenizer.json with an end-of-text special token (as
    export_hf writes it to generation_config.json) whose model's generate() takes it, else {}.
    """
    from speedtronic_data.hf_tokenizer import special_tokens

    text = getattr(codec, "text", None)  # a JsonTokenizer's tokenizer.json; bytes have no eos
    if not isinstance(text, str):
        return {}
    eos = special_tokens(json.loads(text))[1]
    # _check_fits has kept the tokenizer's ids below the model's vocabulary.
    if eos is None or not _takes(model.generate, "eos_token_id"):
        return {}  # a custom model's generate() as sample asks for it: (ids, n, temperature, top_k)
    return {"eos_token_id": eos[1]}


def export_checkpoint(path: PathLike, out_dir: PathLike) -> Path:
    """Write model.safetensors and config.json (the model section) to out_dir; return out_dir.
    Both appear together: a failure on the way leaves an earlier export in out_dir whole; weight
    shards an earlier export left are removed, as are the other files of an earlier --format hf
    export (hf_export_leftovers).
    """
    from safetensors.torch import save_model

    from speedtronic_config.atomic import publish_private_file, staged_files
    from speedtronic_model.hf_llama import WEIGHT_FILES

    model, config = load_checkpoint_model(path)
    out_dir = Path(out_dir)
    # The shards and index of an earlier --format hf export would sit beside other weights.
    replaces = (*WEIGHT_FILES, *hf_export_leftovers(out_dir))
    with staged_files(out_dir, replaces=replaces) as stage:
        weights = stage / "model.safetensors"
        save_model(model, str(weights), metadata={"format": "pt"})  # dedupes tied tensors
        publish_private_file(weights, weights)  # safetensors creates it 0600
        model_config = config.to_dict()["model"]
        (stage / "config.json").write_text(json.dumps(model_config, indent=2) + "\n")
    return out_dir


def load_exported(out_dir: PathLike) -> Any:
    """Return the model that export_checkpoint wrote to out_dir, ready for inference."""
    from safetensors.torch import load_model

    from speedtronic_config import ModelConfig
    from speedtronic_model import build_model

    out_dir = Path(out_dir)
    values = json.loads((out_dir / "config.json").read_text())
    if "model_type" in values:  # a Llama config.json, which ModelConfig would call bad keywords
        raise UsageError(
            f"{out_dir} is a transformers export (--format hf): load it with transformers' "
            "AutoModelForCausalLM.from_pretrained, or into a reference model with "
            "speedtronic_model.load_llama(model, folder)"
        )
    model = build_model(ModelConfig(**values))
    load_model(model, str(out_dir / "model.safetensors"))  # strict: raises on any mismatch
    return model.eval()


def hf_replaced_files() -> tuple[str, ...]:
    """Return the globs of the files an hf export replaces, deleting those it does not write.

    Such a file in the export's folder or Hub repository was left by an earlier export or another
    model (weights of other sharding, another tokenizer's extras, a loss curve), and transformers
    would read it with the new files.
    """
    from speedtronic.model_card import CURVE_NAME
    from speedtronic_data.hf_tokenizer import TOKENIZER_EXTRAS
    from speedtronic_model.hf_llama import WEIGHT_FILES

    return (*WEIGHT_FILES, *TOKENIZER_EXTRAS, CURVE_NAME)


def hf_export_leftovers(out_dir: Path) -> tuple[str, ...]:
    """Return the names of the files an earlier --format hf export left in out_dir that a
    --format speedtronic export there removes: transformers would read them beside the new
    config.json. None unless out_dir's config.json is a transformers one (a folder of a
    speedtronic export keeps a tokenizer.json the user put beside it); the README.md only while it
    is the export's model card, so a README of the user's own stays.
    """
    from speedtronic.model_card import CARD_NAME, is_model_card
    from speedtronic_data.hf_tokenizer import HF_TOKENIZER_FILES
    from speedtronic_model.hf_llama import GENERATION_CONFIG_NAME

    try:
        config = json.loads((out_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no earlier export, or not one of ours: nothing to remove
        return ()
    if not isinstance(config, dict) or "model_type" not in config:  # a speedtronic config.json
        return ()
    card = (CARD_NAME,) if is_model_card(out_dir / CARD_NAME) else ()
    return (*hf_replaced_files(), GENERATION_CONFIG_NAME, *HF_TOKENIZER_FILES, *card)


def export_hf(
    path: PathLike,
    out_dir: PathLike,
    *,
    tokenizer: PathLike | None = None,
    max_shard_bytes: int | None = None,
    repo_id: str | None = None,
) -> Path:
    """Write a checkpoint as a `transformers` Llama folder (config.json, generation_config.json,
    safetensors weights, tokenizer.json, tokenizer_config.json, README.md model card); return it.
    A README.md in out_dir that is not such a card is refused (UsageError), not replaced.
    """
    from speedtronic.model_card import CARD_NAME, is_model_card, write_model_card
    from speedtronic_config.atomic import staged_files
    from speedtronic_data import write_hf_tokenizer
    from speedtronic_model import llama_config, save_llama
    from speedtronic_model.hf_llama import DEFAULT_MAX_SHARD_BYTES

    out_dir = Path(out_dir)
    readme = out_dir / CARD_NAME
    if readme.exists() and not is_model_card(readme):  # the user's own, or another model's card
        raise UsageError(
            f"{readme} is not a model card an export wrote, and --format hf writes its card "
            "there: move that README.md out of the folder, or export into another folder"
        )
    path = resolve_checkpoint(path)  # the model card looks for the run's metrics beside it
    state = read_checkpoint(path)
    model, config = _model_from_state(state, path)
    llama_config(model)  # a model that does not map fails here, before anything is written
    codec = resolve_tokenizer(config, tokenizer, recorded=state.get("tokenizer"), checkpoint=path)
    record = _check_fits(codec, config, tokenizer, export=True)
    # Staged, then renamed in: a failure on the way (disk full, Ctrl-C) leaves an earlier export
    # in out_dir whole, not new weights beside an old card.
    with staged_files(out_dir, replaces=hf_replaced_files()) as stage:
        bos, eos = write_hf_tokenizer(stage, codec, model_max_length=config.model.max_seq_len)
        save_llama(
            model,
            stage,
            bos_token_id=bos,
            eos_token_id=eos,
            max_shard_bytes=max_shard_bytes or DEFAULT_MAX_SHARD_BYTES,
        )
        write_model_card(stage, config, state, checkpoint=path, tokenizer=record, repo_id=repo_id)
    return out_dir
