"""The transparency log's commands: keygen, prove, verify-bundle and log backfill (verify --log is in verify)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from archiver.cli.base import friendly_errors, instance_option, main, resolve, settings_options, store_for
from archiver.cli.params import SESSION_ID, Checked, LocalPath
from archiver.config.options import STORE_SCOPES
from archiver.config.settings import Settings
from archiver.config.values import parse_duration
from archiver.errors import ConfigError, LocalFileError, LogVerificationError
from archiver.tlog.note import Verifier

KEY_HELP = "The log's public key (name+id+key, from `archiver keygen`) or a file holding it."


def verifier_for(key: str | None, settings: Settings) -> Verifier:
    """--key, else the public half of --tlog-key-file; ConfigError when neither is given."""
    from archiver.tlog.keyfile import load_signer, load_verifier

    if key:
        return load_verifier(key)
    if settings.tlog_key_file is not None:
        return load_signer(settings.tlog_key_file).verifier
    raise ConfigError("give the log's public key with --key (or its signing key with --tlog-key-file)")


@main.command()
@click.option("--name", required=True, metavar="NAME", help="Key name, the logs' origin prefix: example.com/archiver.")
@click.option(
    "-o", "--out", "out", type=LocalPath(dir_okay=False, path_type=Path), default=Path("log.key"), show_default=True,
    help="The private signing key file (created with mode 0600; never replaced).",
)  # fmt: skip
@click.option(
    "--public", type=LocalPath(dir_okay=False, path_type=Path), default=None,
    help="The public verifier key file. [default: OUT with .pub]",
)  # fmt: skip
@friendly_errors
def keygen(name: str, out: Path, public: Path | None) -> None:
    """Create the transparency log's Ed25519 signing key and its public verifier key (printed too)."""
    from archiver.tlog.keyfile import write_keypair

    signer = write_keypair(name, out, public or out.with_suffix(".pub"))
    click.echo(signer.verifier.encode())


@main.command()
@click.argument("session_id", type=SESSION_ID)
@instance_option("the newest")
@click.option(
    "-o", "--out", "out", required=True, type=LocalPath(dir_okay=False, path_type=Path),
    help="Where to write the proof bundle (one JSON file).",
)  # fmt: skip
@click.option("--key", default=None, metavar="PUBKEY", help=KEY_HELP)
@settings_options(STORE_SCOPES)
@friendly_errors
def prove(session_id: str, instance: str | None, out: Path, key: str | None, **kwargs: Any) -> None:
    """Write a proof bundle of an archive (manifest, leaf, inclusion proof, signed checkpoint) for
    someone outside to check offline with `archiver verify-bundle` or verify_bundle.py."""
    from archiver.retrieval.query import load_archive
    from archiver.tlog.prove import prove as make_bundle

    settings = resolve(kwargs)
    verifier = verifier_for(key, settings)
    store = store_for(settings)
    try:
        loaded = load_archive(store, session_id, instance)
        bundle = make_bundle(store, verifier, session_id, loaded.ref.instance)
    finally:
        store.close()
    try:
        out.write_bytes(bundle)
    except OSError as exc:
        raise LocalFileError(f"cannot write {out}: {exc.strerror}") from None
    click.echo(f"wrote {out} ({len(bundle)} bytes)")


@main.command("verify-bundle")
@click.argument("bundle", type=LocalPath(dir_okay=False, exists=True, path_type=Path))
@click.option("--key", required=True, metavar="PUBKEY", help=KEY_HELP)
@click.option(
    "--tsa-cert", "tsa_certs", multiple=True, type=LocalPath(dir_okay=False, exists=True, path_type=Path),
    help="A trusted root certificate (PEM) of the timestamp authority: the bundle's timestamp is then "
    "verified, not only matched to the checkpoint (repeatable).",
)  # fmt: skip
@click.argument("files", nargs=-1, type=LocalPath(dir_okay=False, exists=True, path_type=Path))
@friendly_errors
def verify_bundle(bundle: Path, key: str, tsa_certs: tuple[Path, ...], files: tuple[Path, ...]) -> None:
    """Verify a proof bundle offline (and downloaded FILES against its manifest); exit 1 when it does not."""
    import base64
    import json

    from archiver.tlog import standalone, timestamp
    from archiver.tlog.keyfile import load_verifier

    vkey = load_verifier(key).encode()
    try:
        data = bundle.read_bytes()
        roots = [_certificate(path) for path in tsa_certs]
    except OSError as exc:
        raise LocalFileError(f"cannot read {exc.filename}: {exc.strerror}") from None
    try:
        result = standalone.verify(data, vkey, files)
    except standalone.BundleError as exc:
        raise LogVerificationError(f"the bundle does not verify: {exc}") from None
    click.echo(result.report(timestamp_line=False))  # the timestamp is checked (and reported) below
    document = json.loads(data)
    if document.get("timestamp"):
        stamp = timestamp.check(base64.b64decode(document["timestamp"]), document["checkpoint"].encode(), roots)
        how = "verified against --tsa-cert" if stamp.verified else "not verified: give --tsa-cert"
        click.echo(f"  checkpoint timestamped {stamp.time.isoformat()} by {stamp.authority} ({how})")
    elif roots:
        raise LogVerificationError("the bundle carries no timestamp to verify against --tsa-cert")


def _certificate(path: Path) -> Any:
    from cryptography import x509

    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except ValueError:
        raise ConfigError(f"{path} is not a PEM certificate") from None


@main.group("log")
def log_group() -> None:
    """The transparency log of archives."""


@log_group.command("backfill")
@click.option(
    "--writer", default="backfill", show_default=True, metavar="NAME",
    help="The log to append to (never a running daemon's own, shard-S-replica-R).",
)  # fmt: skip
@click.option(
    "--min-age", "min_age", default="1h", show_default=True, metavar="DURATION",
    type=Checked(parse_duration, "duration"),
    help="Skip archives younger than this: a running daemon logs them itself (appending one it has "
    "queued but not yet checkpointed would make it a leaf of two logs). Run again later for those.",
)  # fmt: skip
@settings_options(STORE_SCOPES)
@friendly_errors
def backfill(writer: str, min_age: str, **kwargs: Any) -> None:
    """Append the archives made before the log existed, oldest first (the log proves they existed
    since they were logged, not since they were archived). Already logged archives are skipped."""
    from archiver.layout.keys import check_log_writer
    from archiver.tlog.backfill import backfill as run_backfill
    from archiver.tlog.keyfile import load_signer

    try:
        check_log_writer(writer)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    settings = resolve(kwargs)
    if settings.tlog_key_file is None:
        raise ConfigError("log backfill signs checkpoints: give the signing key with --tlog-key-file")
    signer = load_signer(settings.tlog_key_file)
    store = store_for(settings)
    witness_store = None
    try:
        witness = None
        if settings.tlog_witness_store is not None:
            from archiver.store import open_store
            from archiver.tlog.witness import Witness

            witness_store = open_store(settings.tlog_witness_store, s3_endpoint_url=settings.s3_endpoint_url)
            witness = Witness(witness_store)
        report = run_backfill(store, signer, writer, time.time, witness=witness, min_age=parse_duration(min_age))
    finally:
        store.close()
        if witness_store is not None:
            witness_store.close()
    click.echo(
        f"appended {report.appended} archives to log {writer} (now {report.size} leaves); "
        f"{report.already_logged} already logged, {report.unreadable} unreadable manifests skipped, "
        f"{report.too_recent} younger than --min-age left to the daemons"
    )
    sys.exit(1 if report.unreadable else 0)
