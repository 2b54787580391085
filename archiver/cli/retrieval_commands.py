"""The commands that read an archive: ls, show, logs, get, verify, grep, index-players, hold and release."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO, cast

import click

from archiver.cli.base import (
    _TIME_HELP,
    as_dict,
    format_option,
    friendly_errors,
    instance_option,
    main,
    read_command,
    resolve,
    settings_options,
    store_for,
    store_opener,
)
from archiver.cli.params import PLAYER_ID, SESSION_ID, LocalPath
from archiver.config import inputs
from archiver.config.options import STORE_SCOPES
from archiver.config.settings import Settings
from archiver.config.values import MAX_COUNT, MAX_WORKERS
from archiver.errors import ConfigError, LocalFileError
from archiver.textsafe import one_line, printable

#: `archiver grep`'s exit status when the search stopped at its budget (0/1/2 are grep's own).
GREP_STOPPED = 3
#: Parallel HEADs of a verify without download (small requests: latency-bound, not bandwidth-bound).
VERIFY_HEAD_WORKERS = 16


def _processes(value: str) -> int:
    """``--processes``: a count of 1..MAX_WORKERS, or ``auto`` (one per CPU); ConfigError otherwise."""
    if value == "auto":
        return os.cpu_count() or 1
    try:
        return inputs.count(value, "--processes", low=1, high=MAX_WORKERS)
    except ValueError:
        raise ConfigError(
            f"--processes: expected a number of processes (at least 1) or auto, up to {MAX_WORKERS}, "
            f"got {inputs.shown(value)}"
        ) from None


def _session_filters(
    since: str | None, until: str | None, labels: tuple[str, ...], now: float
) -> tuple[float, float | None, dict[str, str]]:
    """The --since/--until range and the --label pairs of `ls` and `grep`; a usage error when malformed."""
    from archiver.retrieval import retrieve

    try:
        start, end = retrieve.parse_time_range(since, until, now)
        return start, end, dict(retrieve.parse_label(value) for value in labels)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@main.command("ls")
@click.option("--since", metavar="TIME", help=f"Ended at or after TIME: {_TIME_HELP}. [default: 24h]")
@click.option("--until", metavar="TIME", help="Ended at or before TIME (same forms). [default: no bound]")
@click.option("--image", metavar="NAME[:TAG]", help="Only this image (NAME or NAME:TAG).")
@click.option("--location", metavar="LOCATION", help="Only this location.")
@click.option(
    "--label",
    "labels",
    multiple=True,
    metavar="KEY=VALUE",
    help="Only sessions with this label (repeatable; all must match).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1, max=MAX_COUNT),
    default=None,
    metavar="N",
    help="At most N sessions (the newest).",
)
@click.option(
    "--player", metavar="ID", default=None, type=PLAYER_ID,
    help="Only sessions this player took part in (reads the player index, not the hours of the range).",
)  # fmt: skip
@format_option()
@settings_options(STORE_SCOPES)
@friendly_errors
def ls_command(
    since: str | None, until: str | None, image: str | None, location: str | None,
    labels: tuple[str, ...], limit: int | None, player: str | None, fmt: str, **kwargs: Any,
) -> None:  # fmt: skip
    """List archived sessions by end time, newest first (reads only the index hours of the range)."""
    from archiver.retrieval import retrieve

    settings = resolve(kwargs)
    now = time.time()
    start, end, wanted = _session_filters(since, until, labels, now)
    store = store_for(settings)
    try:
        entries = retrieve.list_sessions(
            store, since=start, until=end, image=image, location=location, labels=wanted, limit=limit, now=now,
            player=player,
        )  # fmt: skip
        retrieve.render_sessions(entries, sys.stdout, fmt=fmt)
    finally:
        store.close()


@main.command()
@click.argument("session_id", type=SESSION_ID)
@format_option("json: the stored manifest document as is.")
@instance_option("the newest")
@settings_options(STORE_SCOPES)
@friendly_errors
def show(session_id: str, fmt: str, instance: str | None, **kwargs: Any) -> None:
    """The manifest of an archived session, readable."""
    from archiver.retrieval import retrieve

    store = store_for(resolve(kwargs))
    try:
        retrieve.show_session(store, session_id, sys.stdout, fmt="json" if fmt == "json" else "text", instance=instance)
    finally:
        store.close()


@main.command()
@click.argument("session_id", type=SESSION_ID)
@click.option(
    "--stream", type=click.Choice(["stdout", "stderr"]), default=None,
    help="Only this stream (where the upstream told them apart; else every line, with a note).",
)  # fmt: skip
@click.option(
    "--grep", "pattern", metavar="REGEX", help="Only lines matching this RE2 regular expression (searched anywhere)."
)
@click.option("-i", "--ignore-case", is_flag=True, help="--grep ignores case.")
@click.option(
    "--capture", is_flag=True,
    help="The live capture kept beside the logs read after the end (when the two differ).",
)  # fmt: skip
@instance_option("the newest")
@settings_options(STORE_SCOPES)
@friendly_errors
def logs(
    session_id: str,
    stream: str | None,
    pattern: str | None,
    ignore_case: bool,
    capture: bool,
    instance: str | None,
    **kwargs: Any,
) -> None:
    """The archived logs as plain text lines, whatever format the upstream sent."""
    from archiver.retrieval import retrieve

    try:
        grep = retrieve.compile_grep(pattern, ignore_case=ignore_case) if pattern is not None else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--grep") from None
    store = store_for(resolve(kwargs))
    try:
        retrieve.print_logs(
            store, session_id, sys.stdout, stream=stream, grep=grep, instance=instance, capture=int(capture)
        )
    finally:
        store.close()


@main.command()
@click.argument("session_id", type=SESSION_ID)
@click.option(
    "--out", "out_dir", type=LocalPath(file_okay=False, path_type=Path), default=Path("."), show_default=True,
    help="Downloads go to OUT/<session id, escaped>/ (OUT/<session id, escaped>.<instance>/ for an instance).",
)  # fmt: skip
@click.option(
    "--extract", is_flag=True, help="Also unpack artifacts (unsafe members skipped and listed) and write logs.txt."
)
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr. [default: when a terminal]")
@instance_option("the newest")
@settings_options(STORE_SCOPES)
@friendly_errors
def get(
    session_id: str, out_dir: Path, extract: bool, progress: bool | None, instance: str | None, **kwargs: Any
) -> None:
    """Download everything of an archived session, verifying each file's sha256."""
    from archiver.retrieval import retrieve

    store = store_for(resolve(kwargs))
    try:
        loaded = retrieve.load_archive(store, session_id, instance)
        if sys.stderr.isatty() if progress is None else progress:
            total = retrieve.download_size(loaded.manifest)
            with click.progressbar(length=total, label="downloading", file=sys.stderr) as bar:
                result = retrieve.download_session(
                    store, session_id, out_dir, extract=extract, progress=bar.update, loaded=loaded
                )
        else:
            result = retrieve.download_session(store, session_id, out_dir, extract=extract, loaded=loaded)
        retrieve.render_download(result, sys.stdout)
    finally:
        store.close()


@main.command()
@click.argument("session_ids", nargs=-1, type=SESSION_ID)
@click.option("--since", metavar="TIME", help=f"Verify every session that ended since TIME: {_TIME_HELP}.")
@click.option("--until", metavar="TIME", help="With --since: up to TIME.")
@click.option(
    "--deep", is_flag=True,
    help="Download and re-hash every byte (default: prove each object by the SHA-256 checksum the store keeps).",
)  # fmt: skip
@click.option(
    "--require-store-proof", is_flag=True,
    help="Exit 1 when an object is not provable by the store (it keeps no SHA-256 checksum for it) "
    "instead of counting it; --deep proves such objects by their bytes.",
)  # fmt: skip
@click.option(
    "--processes", default="auto", metavar="N|auto", show_default=True,
    help="Processes sharing a large run over S3 (the client's CPU per request bounds one); 1: threads only.",
)  # fmt: skip
@instance_option("every archive of each ID")
@click.option(
    "--log", "check_log", is_flag=True,
    help="Check the transparency logs instead: signatures, tiles, consistency with --checkpoint, and that "
    "every archive is a leaf whose manifest is unchanged (--deep: and every object re-hashed).",
)  # fmt: skip
@click.option(
    "--checkpoint", "checkpoints", multiple=True, type=LocalPath(dir_okay=False, exists=True, path_type=Path),
    help="With --log: a signed checkpoint kept earlier, or a proof bundle (its checkpoint) (repeatable): "
    "the log must still extend it.",
)  # fmt: skip
@click.option("--key", default=None, metavar="PUBKEY", help="With --log: the log's public key (or file).")
@format_option()
@settings_options(STORE_SCOPES)
@friendly_errors
def verify(
    session_ids: tuple[str, ...], since: str | None, until: str | None, deep: bool, require_store_proof: bool,
    processes: str, instance: str | None, check_log: bool, checkpoints: tuple[Path, ...], key: str | None, fmt: str,
    **kwargs: Any,
) -> None:  # fmt: skip
    """Check stored objects against their manifests (every archive of each ID) without downloading them:
    the store's own SHA-256 checksum must match (--deep re-hashes the bytes); exit 1 when anything is wrong.
    Objects the store cannot prove (it keeps no checksum) are counted as such, not failed."""
    from archiver.retrieval import retrieve

    if check_log:
        if session_ids or since or until or instance:
            raise click.UsageError("--log checks the whole store: give no session ids, --since or --instance")
        _verify_log(resolve(kwargs), checkpoints, key, deep=deep, as_json=fmt == "json")
    if checkpoints or key:
        raise click.UsageError("--checkpoint and --key go with --log")
    if session_ids and (since or until):
        raise click.UsageError("give session ids or --since/--until, not both")
    if instance is not None and not session_ids:
        raise click.UsageError("--instance picks an archive of the session ids given; give at least one ID")
    settings = resolve(kwargs)
    now = time.time()
    try:
        start, end = retrieve.parse_time_range(since, until, now)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    count = _processes(processes)
    store = store_for(settings)
    as_json = fmt == "json"
    try:
        report = retrieve.verify(
            store, session_ids=session_ids, instance=instance, since=start, until=end, now=now, deep=deep,
            workers=4 if deep else VERIFY_HEAD_WORKERS, opener=store_opener(settings), processes=count,
            # A table reports problems as they are found (a long run shows progress); JSON at the end.
            on_problem=None if as_json else lambda problem: click.echo(problem.line()),
        )  # fmt: skip
        failed = retrieve.verify_failed(report, require_store_proof=require_store_proof)
        if as_json:
            document = {
                "ok": not failed, "sessions": report.sessions, "objects": report.objects, "bytes": report.bytes,
                "proved": report.proved, "unproven": report.unproven,
                "problems": [as_dict(problem) for problem in report.problems],
            }  # fmt: skip
            click.echo(json.dumps(document))
        else:
            retrieve.render_verify(report, sys.stdout, problems=False, require_store_proof=require_store_proof)
    finally:
        store.close()
    sys.exit(1 if failed else 0)


def _verify_log(
    settings: Settings, checkpoints: tuple[Path, ...], key: str | None, *, deep: bool, as_json: bool
) -> None:
    """`verify --log`: every finding one line (or one JSON document); exit 1 when there is any."""
    from archiver.cli.tlog_commands import verifier_for
    from archiver.tlog.audit import audit
    from archiver.tlog.checkpoint import open_signed
    from archiver.tlog.prove import kept_checkpoint

    verifier = verifier_for(key, settings)
    kept = []
    for path in checkpoints:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise LocalFileError(f"cannot read {path}: {exc.strerror}") from None
        kept.append(open_signed(kept_checkpoint(data), verifier))
    if settings.tlog_witness_store is not None:
        from archiver.store import open_store
        from archiver.tlog.witness import Witness

        witness_store = open_store(settings.tlog_witness_store, s3_endpoint_url=settings.s3_endpoint_url)
        try:
            kept.extend(Witness(witness_store).all_latest(verifier))
        finally:
            witness_store.close()
    store = store_for(settings)
    try:
        report = audit(store, verifier, kept=kept, objects=deep)
    finally:
        store.close()
    if as_json:
        click.echo(json.dumps({
            "ok": not report.findings, "logs": report.logs, "leaves": report.leaves, "archives": report.archives,
            "findings": [as_dict(f) for f in report.findings],
        }))  # fmt: skip
    else:
        for finding in report.findings:
            click.echo(printable(finding.line()))
        sizes = ", ".join(f"{w} {n}" for w, n in sorted(report.logs.items())) or "none"
        click.echo(f"{len(report.logs)} logs ({sizes} leaves), {report.archives} archives: "
                   f"{len(report.findings)} problems")  # fmt: skip
    sys.exit(1 if report.findings else 0)


class _BelowBar:
    """stdout that clears the progress bar's line on stderr before each write, both being one terminal."""

    def __init__(self, out: TextIO, bar: TextIO) -> None:
        self._out = out
        self._bar = bar

    def write(self, text: str) -> int:
        self._bar.write("\r\x1b[K")
        self._bar.flush()
        return self._out.write(text)

    def flush(self) -> None:
        self._out.flush()


@main.command()
@click.argument("pattern")
@click.option("--since", metavar="TIME", help=f"Sessions that ended at or after TIME: {_TIME_HELP}. [default: 24h]")
@click.option("--until", metavar="TIME", help="Ended at or before TIME (same forms). [default: no bound]")
@click.option("--image", metavar="NAME[:TAG]", help="Only this image (NAME or NAME:TAG).")
@click.option("--location", metavar="LOCATION", help="Only this location.")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="Only this label (repeatable).")
@click.option("--player", metavar="ID", default=None, type=PLAYER_ID, help="Only sessions this player took part in.")
@click.option("-F", "--fixed-strings", "fixed", is_flag=True, help="PATTERN is a plain string, not a regex.")
@click.option("-i", "--ignore-case", is_flag=True, help="Ignore case.")
@click.option(
    "--workers", type=click.IntRange(min=1, max=64), default=4, show_default=True, help="Sessions searched at once."
)
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr. [default: when a terminal]")
@format_option("json: one JSON object per hit (session, instance, stream, line; source where several logs).")
@settings_options(STORE_SCOPES, command="grep")
@friendly_errors
def grep(
    pattern: str, since: str | None, until: str | None, image: str | None, location: str | None,
    labels: tuple[str, ...], player: str | None, fixed: bool, ignore_case: bool, workers: int,
    progress: bool | None, fmt: str, **kwargs: Any,
) -> None:  # fmt: skip
    """Search the archived logs of the sessions that ended in a time range; prints `session  stream  line`.

    PATTERN is an RE2 regular expression (linear time; no backreferences or lookaround) searched
    anywhere in each line (like `grep -E`). Exit status as grep: 0 when a line matched, 1 when none
    did, 2 on an error (an archive that could not be read or does not match its manifest is reported
    and the search goes on); 3 when the search stopped at its budget (--grep.max-seconds,
    --grep.max-bytes): the hits found until then are printed, and stderr says so. A session whose
    archive keeps a live capture beside its logs has both searched, each hit saying which:
    `session  logs|capture  stream  line` (`logs --capture` prints the capture).
    """
    from archiver.errors import ArchiverError
    from archiver.index import grepfilter
    from archiver.retrieval import retrieve

    settings, limits, _ = read_command(kwargs, "grep")  # grep has no deprecated names to log
    budget = retrieve.SearchBudget(limits["grep_max_seconds"], limits["grep_max_bytes"])
    now = time.time()
    try:
        matcher = retrieve.Matcher(pattern, fixed=fixed, ignore_case=ignore_case)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="PATTERN") from None
    start, end, wanted = _session_filters(since, until, labels, now)
    store = store_for(settings)
    escape = sys.stdout.isatty()
    try:
        entries = retrieve.list_sessions(
            store, since=start, until=end, image=image, location=location, labels=wanted, now=now, player=player
        )
        # The columnar index's token filters: read only the logs that may hold the pattern's tokens.
        selection = grepfilter.select(
            store, entries, pattern, fixed=fixed, since=start, until=max(now, start) if end is None else end
        )
        if selection.note:
            click.echo(f"note: {selection.note}", err=True)
        entries = selection.entries
        options: dict[str, Any] = {"fmt": fmt, "escape": escape, "workers": workers, "budget": budget}
        if sys.stderr.isatty() if progress is None else progress:
            # Hits on the bar's terminal first clear its line (the bar redraws below them).
            out = cast(TextIO, _BelowBar(sys.stdout, sys.stderr)) if escape and sys.stderr.isatty() else sys.stdout
            with click.progressbar(length=len(entries), label="searching", file=sys.stderr) as bar:
                report = retrieve.grep_sessions(store, entries, matcher, out, progress=bar.update, **options)
        else:
            report = retrieve.grep_sessions(store, entries, matcher, sys.stdout, **options)
        sys.stdout.flush()
    except ArchiverError as exc:
        # grep's convention: 2 for trouble (not 1, which means "nothing found").
        click.echo(f"error: {one_line(str(exc))}", err=True)
        sys.exit(2)
    finally:
        store.close()
    if report.stopped is not None:
        click.echo(f"archiver grep: {report.stopped}; narrow --since or the pattern", err=True)
    sys.exit(2 if report.problems else GREP_STOPPED if report.stopped else 0 if report.hits else 1)


@main.command("index-players")
@click.option(
    "--checkpoint", type=LocalPath(dir_okay=False, path_type=Path), default=None, metavar="FILE",
    help="Remember the last manifest done in FILE; a run interrupted resumes after it.",
)  # fmt: skip
@settings_options(STORE_SCOPES)
@friendly_errors
def index_players_command(checkpoint: Path | None, **kwargs: Any) -> None:
    """Write the player index (`ls --player`) of archives made before it existed; safe to run again."""
    import os

    from archiver.retrieval import retrieve

    start_after = ""
    if checkpoint is not None and checkpoint.exists():
        try:
            start_after = checkpoint.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise LocalFileError(f"--checkpoint {checkpoint}: cannot be read ({exc})") from None
        click.echo(f"resuming after {printable(start_after)}", err=True)

    def remember(report: retrieve.ReindexReport) -> None:
        if checkpoint is not None and report.last_key is not None:
            partial = checkpoint.with_name(checkpoint.name + ".partial")
            try:
                partial.write_text(report.last_key + "\n", encoding="utf-8")
                os.replace(partial, checkpoint)
            except OSError as exc:
                raise LocalFileError(f"--checkpoint {checkpoint}: cannot be written ({exc.strerror})") from None

    store = store_for(resolve(kwargs))
    try:
        report = retrieve.index_players(store, start_after=start_after, on_batch=remember)
    finally:
        store.close()
    click.echo(report.line())
    sys.exit(1 if report.problems else 0)


def _legal_hold(session_id: str, instance: str | None, on: bool, kwargs: dict[str, Any]) -> None:
    from archiver.retrieval.legalhold import set_legal_hold

    store = store_for(resolve(kwargs))
    try:
        click.echo(set_legal_hold(store, session_id, on=on, instance=instance).line())
    finally:
        store.close()


@main.command()
@click.argument("session_id", type=SESSION_ID)
@instance_option("the newest")
@settings_options(STORE_SCOPES)
@friendly_errors
def hold(session_id: str, instance: str | None, **kwargs: Any) -> None:
    """Place an S3 legal hold on every object of a session's archive (nobody can delete them until released)."""
    _legal_hold(session_id, instance, True, kwargs)


@main.command()
@click.argument("session_id", type=SESSION_ID)
@instance_option("the newest")
@settings_options(STORE_SCOPES)
@friendly_errors
def release(session_id: str, instance: str | None, **kwargs: Any) -> None:
    """Clear the legal hold of every object of a session's archive (their retention, if any, still applies)."""
    _legal_hold(session_id, instance, False, kwargs)
