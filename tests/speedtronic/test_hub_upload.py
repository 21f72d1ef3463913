"""export --push-to-hub against the loopback Hub server, through the real huggingface_hub client;
the token comes from the environment and never shows up anywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import HfApi
from interop_testkit import noisy_checkpoint, run_config

from speedtronic.artifacts import export_hf
from speedtronic.errors import UsageError
from speedtronic.hub_upload import push_to_hub
from speedtronic_diloco.testing.hub_server import HubServer

SECRET = "hf_PUSH_secret_token_value"


@pytest.fixture
def server():
    with HubServer() as running:
        yield running


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, byte_shards) -> Path:
    return noisy_checkpoint(run_config(tmp_path_factory.mktemp("run"), byte_shards), step=4)


def local_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_push_uploads_every_file(tmp_path, server, checkpoint, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    out = export_hf(checkpoint, tmp_path / "hf", repo_id="me/tiny")
    url = push_to_hub(out, "me/tiny", endpoint=server.url)
    assert url.endswith("/me/tiny")
    remote = server.files("me/tiny")
    assert {k: v for k, v in remote.items() if k != ".gitattributes"} == local_files(out)
    assert not server.store.repos[("model", "me/tiny")].private
    # pushing again reuses the repository: one more commit, same files
    push_to_hub(out, "me/tiny", endpoint=server.url)
    assert len(server.store.repos[("model", "me/tiny")].commits) == 3
    captured = capsys.readouterr()
    assert SECRET not in captured.out + captured.err
    assert all(SECRET.encode() not in data for data in remote.values())


def test_bad_repository_id_and_folder(tmp_path, server):
    with pytest.raises(UsageError, match="not a repository id"):
        push_to_hub(tmp_path, "a/b/c", endpoint=server.url)
    with pytest.raises(UsageError, match="no such export folder"):
        push_to_hub(tmp_path / "missing", "me/x", endpoint=server.url)
    with pytest.raises(UsageError, match=r"'tiny': give OWNER/tiny \(your user or organization"):
        push_to_hub(tmp_path, "tiny", endpoint=server.url)  # the card could not name its repo


def test_an_unreachable_hub_names_the_endpoint_and_keeps_the_export(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with HubServer() as stopped:
        endpoint = stopped.url  # nothing listens there any more
    with pytest.raises(RuntimeError) as failed:
        push_to_hub(folder, "me/x", endpoint=endpoint)
    message = str(failed.value)
    assert message.startswith(f"pushing to me/x on {endpoint} failed (") and "\n" not in message
    assert f"the export in {folder} is complete: push it again with" in message
    assert SECRET not in message and (folder / "config.json").read_text() == "{}"


def test_cli_push_to_hub_private(tmp_path, server, checkpoint):
    env = {
        **os.environ,
        "HF_ENDPOINT": server.url,
        "HF_TOKEN": SECRET,
        "HF_HOME": str(tmp_path / "hf-home"),  # no login cache of the machine's user
    }
    result = subprocess.run(
        [sys.executable, "-m", "speedtronic", "export", str(checkpoint), str(tmp_path / "hf")]
        + ["--format", "hf", "--push-to-hub", "me/private-run", "--private"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].endswith("/me/private-run")
    assert SECRET not in result.stdout + result.stderr
    assert server.store.repos[("model", "me/private-run")].private
    remote = server.files("me/private-run")
    assert '"me/private-run"' in remote["README.md"].decode()
    for path in (tmp_path / "hf").iterdir():
        assert SECRET.encode() not in path.read_bytes()
        assert remote[path.name] == path.read_bytes()


def test_a_push_deletes_the_weights_and_tokenizer_files_an_earlier_push_left(
    tmp_path, server, checkpoint
):
    # transformers loads model.safetensors before an index: a stale one served the old weights.
    whole = export_hf(checkpoint, tmp_path / "whole")
    (whole / "loss_curve.png").write_bytes(b"an earlier run's curve")
    # another tokenizer's files, which transformers would read with the new tokenizer.json
    (whole / "special_tokens_map.json").write_text('{"eos_token": "</s>"}')
    (whole / "added_tokens.json").write_text('{"<extra>": 256}')
    # and another model's chat templates, which transformers would give the new tokenizer
    (whole / "chat_template.jinja").write_text("<|im_start|>")
    (whole / "additional_chat_templates").mkdir()
    (whole / "additional_chat_templates" / "tool_use.jinja").write_text("<|tool|>")
    # a variant the user keeps in a folder of its own (not one of the export's files)
    (whole / "model_int8").mkdir()
    (whole / "model_int8" / "model.safetensors").write_bytes(b"int8 weights")
    # and the staging folder of an export killed half way (kill -9: no cleanup ran)
    (whole / ".staging.x1y2.tmp").mkdir()
    (whole / ".staging.x1y2.tmp" / "model.safetensors").write_bytes(b"half written")
    push_to_hub(whole, "me/tiny", endpoint=server.url)
    remote = server.files("me/tiny")
    assert "additional_chat_templates/tool_use.jinja" in remote
    assert [name for name in remote if ".staging" in name] == []  # it was uploaded
    sharded = export_hf(checkpoint, tmp_path / "sharded", max_shard_bytes=20_000)
    (sharded / "notes.txt").write_text("mine")
    push_to_hub(sharded, "me/tiny", endpoint=server.url)
    remote = server.files("me/tiny")
    # huggingface_hub's delete pattern model*.safetensors matched model_int8/model.safetensors too
    assert remote.pop("model_int8/model.safetensors") == b"int8 weights"
    assert {k: v for k, v in remote.items() if k != ".gitattributes"} == local_files(sharded)
    assert "model.safetensors" not in remote and "model.safetensors.index.json" in remote
    assert len(server.store.repos[("model", "me/tiny")].commits) == 3  # one commit a push


def test_private_refuses_a_public_repository_before_uploading(tmp_path, server, monkeypatch):
    # create_repo(exist_ok=True) leaves an existing repository's visibility as it is: the weights
    # of a push asked to be private were published in the user's public repository.
    monkeypatch.setenv("HF_TOKEN", SECRET)
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    HfApi(endpoint=server.url).create_repo("me/open")  # public, as the Hub creates one
    with pytest.raises(UsageError) as refused:
        push_to_hub(folder, "me/open", private=True, endpoint=server.url)
    message = str(refused.value)
    assert "me/open is public" in message and "\n" not in message
    assert f"the export in {folder} is complete" in message and SECRET not in message
    assert "config.json" not in server.files("me/open")  # nothing uploaded
    push_to_hub(folder, "me/private", private=True, endpoint=server.url)  # a new one: private
    assert server.store.repos[("model", "me/private")].private
    push_to_hub(folder, "me/private", private=True, endpoint=server.url)  # and it stays usable


def test_a_push_refuses_to_replace_the_repositorys_own_readme(tmp_path, server, checkpoint):
    # upload_folder replaced a README.md the user wrote on the Hub with the export's model card.
    api = HfApi(endpoint=server.url)
    api.create_repo("me/own")
    theirs = b"# My model\n\nNotes I wrote on the Hub.\n"
    api.upload_file(path_or_fileobj=theirs, path_in_repo="README.md", repo_id="me/own")
    out = export_hf(checkpoint, tmp_path / "hf", repo_id="me/own")
    commits = len(server.store.repos[("model", "me/own")].commits)
    with pytest.raises(UsageError) as refused:
        push_to_hub(out, "me/own", endpoint=server.url)
    message = str(refused.value)
    assert message.startswith("me/own on ") and "\n" not in message
    assert "has a README.md that is not a model card an export wrote" in message
    assert f"the export in {out} is complete" in message
    assert server.files("me/own")["README.md"] == theirs
    assert len(server.store.repos[("model", "me/own")].commits) == commits  # nothing uploaded
    # the way out the message names: without the folder's card, their README stays
    (out / "README.md").unlink()
    push_to_hub(out, "me/own", endpoint=server.url)
    remote = server.files("me/own")
    assert (
        remote["README.md"] == theirs
        and remote["config.json"] == (out / "config.json").read_bytes()
    )
    # a card an earlier push wrote (edited on the Hub or not) is the export's own: replaced
    card = export_hf(checkpoint, tmp_path / "again", repo_id="me/own") / "README.md"
    api.upload_file(path_or_fileobj=card, path_in_repo="README.md", repo_id="me/own")
    edited = card.read_bytes() + b"\nA line I added.\n"
    api.upload_file(path_or_fileobj=edited, path_in_repo="README.md", repo_id="me/own")
    push_to_hub(card.parent, "me/own", endpoint=server.url)
    assert server.files("me/own")["README.md"] == card.read_bytes()
