"""Upload an export folder to a Hugging Face Hub model repository with huggingface_hub."""

from __future__ import annotations

import glob
import tempfile
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from speedtronic.errors import UsageError, first_line
from speedtronic_config.atomic import temp_glob

# The hidden temporary files and staging folders of atomic writes (.staging.x1y2.tmp/...).
LEFTOVERS = temp_glob("*")


def check_repo_id(repo_id: str) -> None:
    """Raise UsageError unless `repo_id` is a Hub repository id OWNER/NAME, as huggingface_hub
    checks it: before an export, so a typo costs nothing. A bare NAME is refused: the Hub would
    put it under the token's user, but the model card must name the id users load.
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise UsageError(
            f"--push-to-hub {repo_id!r}: not a repository id ({error}); use OWNER/NAME"
        ) from None
    if "/" not in repo_id:
        raise UsageError(
            f"--push-to-hub {repo_id!r}: give OWNER/{repo_id} (your user or organization name), "
            "the id the model card tells users to load"
        )


def push_to_hub(
    folder: Path, repo_id: str, *, private: bool = False, endpoint: str | None = None
) -> str:
    """Create the model repository if needed and upload every file of folder as one commit;
    return the repository URL. Weight files, tokenizer extras and a loss curve an earlier push
    left that folder lacks are deleted in that commit, as export deletes them locally. Refused
    (UsageError) before anything is uploaded: with private, an existing public repository; a
    README.md of the repository's own (not a model card an export wrote) that the folder's card
    would replace.

    The token is huggingface_hub's own: HF_TOKEN, else the `hf auth login` cache. Speedtronic
    never reads, prints or stores it. `endpoint` (default: HF_ENDPOINT, else huggingface.co)
    points at another Hub.
    """
    from huggingface_hub import HfApi

    if not folder.is_dir():
        raise UsageError(f"{folder}: no such export folder")
    check_repo_id(repo_id)
    api = HfApi(endpoint=endpoint)
    kept = (
        f"the export in {folder} is complete: push it again with `hf upload {repo_id} {folder}`, "
        "or rerun the export with --push-to-hub"
    )
    try:
        url = api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        remote = api.list_repo_files(repo_id, repo_type="model")
        refusal = _refusal(api, repo_id, folder, private=private, remote=remote, kept=kept)
        if refusal is None:
            api.upload_folder(
                folder_path=str(folder),
                repo_id=repo_id,
                repo_type="model",
                commit_message="Upload a Speedtronic export",
                # A model.safetensors left by an earlier push would shadow new shards:
                # transformers loads it first. Files uploaded in this commit are never deleted.
                delete_patterns=_replaced_remote_files(remote),
                # What an export or atomic write killed half way left (its staging folder, a
                # temporary file): never part of the export.
                ignore_patterns=[LEFTOVERS, f"{LEFTOVERS}/"],
            )
    except Exception as error:  # network, token, server: name where, and that nothing is lost
        raise RuntimeError(
            f"pushing to {repo_id} on {api.endpoint} failed ({type(error).__name__}: "
            f"{first_line(error)}); {kept}"
        ) from error
    if refusal is not None:
        raise UsageError(refusal)
    return str(url)


def _refusal(
    api: Any, repo_id: str, folder: Path, *, private: bool, remote: list[str], kept: str
) -> str | None:
    """Return why the push must not upload (what was wrong, how to fix it), or None."""
    from speedtronic.model_card import CARD_NAME, is_model_card

    # create_repo leaves an existing repository's visibility as it is: asked for private, the
    # weights would be published.
    if private and api.repo_info(repo_id, repo_type="model").private is not True:
        return (
            f"--private: {repo_id} is public on {api.endpoint} and --private does not change an "
            "existing repository, so nothing was uploaded; make it private in its settings or "
            f"drop --private; {kept}"
        )
    if CARD_NAME in remote and (folder / CARD_NAME).is_file():
        with tempfile.TemporaryDirectory() as scratch:
            theirs = api.hf_hub_download(repo_id, CARD_NAME, repo_type="model", local_dir=scratch)
            if not is_model_card(Path(theirs)):  # the user's own, as export refuses locally
                return (
                    f"{repo_id} on {api.endpoint} has a README.md that is not a model card an "
                    "export wrote, and the push would replace it, so nothing was uploaded; the "
                    f"export in {folder} is complete: rename or delete that README.md in the "
                    "repository and rerun the export with --push-to-hub, or keep it: delete "
                    f"{folder / CARD_NAME} and run `hf upload {repo_id} {folder}`"
                )
    return None


def _replaced_remote_files(remote: list[str]) -> list[str]:
    """Return, as patterns matching only themselves, the repository's files an hf export replaces
    (hf_replaced_files), each `*` within one folder level: huggingface_hub's `*` crosses folders,
    so model*.safetensors would also delete the user's model_int8/model.safetensors.
    """
    from speedtronic.artifacts import hf_replaced_files

    replaced = hf_replaced_files()
    return [
        glob.escape(name)
        for name in remote
        if any(fnmatchcase(name, p) and name.count("/") == p.count("/") for p in replaced)
    ]


__all__ = ["check_repo_id", "push_to_hub"]
