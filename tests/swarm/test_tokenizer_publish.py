"""The project's pinned tokenizer.json travels with its files (issue 38): ``owner
publish`` puts it in the signed weights index (under ``TOKENIZER_ENTRY``), a trainer
or ``owner export`` without it fetches it from the swarm into its work folder, checked
against the pin; volunteers never fetch it and see experts only. A manifest pinning a
tokenizer that is not beside it is refused at publish, in one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio
from typer.testing import CliRunner

from core.cli import app
from core.data.tokenizer import TOKENIZER_FILE, HFTokenizer, tokenizer_sha256, train_bpe
from core.namespaces import moehome_validator
from core.project.chunks import TOKENIZER_ENTRY, ChunkStore
from core.project.distribution import FetchError
from core.project.joining import join_project
from core.project.keys import OwnerKey
from core.project.manifest import ManifestError
from core.project.publish import prepare, serve_project
from core.project.template import write_template
from core.trainer.export import export_project
from core.trainer.tokenizer_file import tokenizer_for
from net.testing import open_swarm

DOCS = ["def f(x):\n    return x + 1\n" * 20, "hello world " * 50]
MISSING = "put the tokenizer.json the manifest pins beside"


def pinned_project(tmp_path: Path, *, beside: bool = True) -> tuple[Path, HFTokenizer]:
    """A small project pinning a BPE trained here; its tokenizer.json beside the
    manifest (``beside``) or elsewhere."""
    folder = tmp_path / ("project" if beside else "elsewhere")
    folder.mkdir(exist_ok=True)
    tokenizer = train_bpe(DOCS, 280, folder / TOKENIZER_FILE)
    path = tmp_path / "project" / "tok.toml"
    path.parent.mkdir(exist_ok=True)
    write_template(path, "tok", tokenizer=(tokenizer.sha256, tokenizer.vocab_size))
    text = (
        path.read_text()
        .replace("grid = [2, 4]", "grid = [2, 2]")
        .replace("mixture_layers = 2", "mixture_layers = 1")
        .replace("hidden = 64", "hidden = 16")
        .replace("inner = 128", "inner = 32")
    )
    path.write_text(text)
    return path, tokenizer


def test_a_pinned_tokenizer_not_beside_the_manifest_is_refused_at_publish(tmp_path):
    path, tokenizer = pinned_project(tmp_path, beside=False)
    with pytest.raises(ManifestError, match=re.escape(MISSING)) as info:
        prepare(path, OwnerKey.generate(), (), tmp_path / "owner")
    assert len(info.value.problems) == 1
    assert "\n" not in info.value.problems[0]
    assert tokenizer.sha256[:12] in info.value.problems[0]
    # another tokenizer beside it is named, and refused all the same
    (path.parent / TOKENIZER_FILE).write_text('{"other": true}')
    with pytest.raises(ManifestError, match=re.escape(MISSING)) as info:
        prepare(path, OwnerKey.generate(), (), tmp_path / "owner")
    other = tokenizer_sha256(b'{"other": true}')
    assert f"{path.parent / TOKENIZER_FILE} is {other[:12]}" in info.value.problems[0]


def test_owner_publish_says_it_publishes_the_tokenizer_or_where_to_put_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MOEHOME_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("MOEHOME_OWNER_PASSPHRASE", "")
    runner = CliRunner()
    assert runner.invoke(app, ["owner", "init"]).exit_code == 0
    path, _ = pinned_project(tmp_path)
    result = runner.invoke(app, ["owner", "publish", str(path), "--no-serve"])
    assert result.exit_code == 0, result.output
    assert "experts:     4 and the tokenizer" in result.output
    (path.parent / TOKENIZER_FILE).unlink()
    result = runner.invoke(app, ["owner", "publish", str(path), "--no-serve"])
    assert result.exit_code == 2
    assert MISSING in result.output


async def test_trainers_fetch_the_published_tokenizer_and_volunteers_never_do(tmp_path):
    path, tokenizer = pinned_project(tmp_path)
    prepared = prepare(path, OwnerKey.generate(), (), tmp_path / "owner")
    pid = prepared.signed.project_id
    entry = prepared.index.files[TOKENIZER_ENTRY]
    assert entry.sha256 == tokenizer.sha256
    uids = list(prepared.signed.manifest.model.expert_uids())
    assert set(prepared.index.files) == {*uids, TOKENIZER_ENTRY}
    async with (
        open_swarm(3, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        owner, trainer, volunteer = swarm.peers
        service = await nursery.start(serve_project, owner, prepared)

        # a trainer with an empty work folder gets the pinned file from the swarm
        workdir = tmp_path / "trainer"
        store = workdir / "trunk-chunks"
        kept = workdir / TOKENIZER_FILE
        got = await tokenizer_for(trainer, prepared.signed, workdir, given=None, store=store)
        assert got == kept
        assert kept.read_bytes() == (path.parent / TOKENIZER_FILE).read_bytes()
        assert HFTokenizer.load(kept, prepared.signed.manifest.data.tokenizer).eos_id >= 0
        # what is kept there, or given, or beside shards, is used without asking
        served = service.served
        assert (
            await tokenizer_for(trainer, prepared.signed, workdir, given=None, store=store) == got
        )
        given = tmp_path / "given.json"
        assert (
            await tokenizer_for(trainer, prepared.signed, workdir, given=given, store=store)
            == given
        )
        shards = tmp_path / "shards"
        shards.mkdir()
        (shards / TOKENIZER_FILE).write_bytes(kept.read_bytes())
        assert (
            await tokenizer_for(
                trainer, prepared.signed, tmp_path / "t2", given=None, beside=[shards], store=store
            )
            is None
        )
        assert service.served == served
        # a work folder holding another tokenizer gets the pinned one instead
        kept.write_text('{"stale": true}')
        assert (
            await tokenizer_for(trainer, prepared.signed, workdir, given=None, store=store) == kept
        )
        assert tokenizer_sha256(kept.read_bytes()) == tokenizer.sha256

        # a volunteer fetches its experts only: never the tokenizer's chunks
        mine = uids[:2]
        _, backends = await join_project(volunteer, pid, mine, data_dir=tmp_path / "vol")
        assert set(backends) == set(mine)
        held = ChunkStore(tmp_path / "vol" / "chunks")
        assert not any(digest in held for digest in entry.chunks)
        with pytest.raises(ValueError, match="not an expert uid"):
            await join_project(volunteer, pid, [TOKENIZER_ENTRY], data_dir=tmp_path / "vol")
        nursery.cancel_scope.cancel()


async def test_a_project_published_without_its_tokenizer_says_how_to_give_it(tmp_path):
    """An owner's older moehome published no tokenizer: the trainer is told what to do."""
    path, _ = pinned_project(tmp_path)
    key = OwnerKey.generate()
    prepared = prepare(path, key, (), tmp_path / "owner")
    # the same manifest signed over an index without the tokenizer, as an older publish did
    from core.project.chunks import WeightsIndex
    from core.project.publish import Prepared
    from core.project.signed import SignedManifest

    files = {u: e for u, e in prepared.index.files.items() if u != TOKENIZER_ENTRY}
    index = WeightsIndex(files)
    prepared.store.put(index.encode())
    older = Prepared(
        SignedManifest.create(prepared.signed.manifest, key, (), index.sha256),
        prepared.store,
        index,
    )
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        owner, trainer = swarm.peers
        await nursery.start(serve_project, owner, older)
        with pytest.raises(FetchError, match=r"published no tokenizer\.json: give"):
            await tokenizer_for(
                trainer, older.signed, tmp_path / "t", given=None, store=tmp_path / "t" / "c"
            )
        nursery.cancel_scope.cancel()
    assert not (tmp_path / "t" / TOKENIZER_FILE).exists()


async def test_export_without_a_tokenizer_fetches_the_pinned_one(tmp_path):
    path, tokenizer = pinned_project(tmp_path)
    prepared = prepare(path, OwnerKey.generate(), (), tmp_path / "owner")
    async with (
        open_swarm(2, validator=moehome_validator()) as swarm,
        trio.open_nursery() as nursery,
    ):
        owner, trainer = swarm.peers
        await nursery.start(serve_project, owner, prepared)
        out = tmp_path / "model"
        exported = await export_project(trainer, prepared.signed, out, workdir=tmp_path / "fresh")
        nursery.cancel_scope.cancel()
    assert exported.trainer_step is None
    assert (tmp_path / "fresh" / TOKENIZER_FILE).read_bytes() == tokenizer.path.read_bytes()
    assert (out / TOKENIZER_FILE).read_bytes() == tokenizer.path.read_bytes()
