"""`archiver_errors_total{where}` exists at 0 for every edge that counts errors, so ArchiverErrors
(`increase(...) > 0`) fires on the first error of an edge, not only from the second one on."""

from __future__ import annotations

import ast
from pathlib import Path

from prometheus_client import CollectorRegistry

from archiver.metrics.selfmetrics import ERROR_EDGES, SelfMetrics

PACKAGE = Path(__file__).resolve().parents[2] / "archiver"


def counted_edges() -> dict[str, str]:
    """Every ``<...>metrics.error("where")`` call in the package: where → the file that counts it."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "error"):
                continue
            owner = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if "metrics" not in name:
                continue  # log.error(...) and the like
            (arg,) = node.args
            assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), f"{path}: a computed `where`"
            found[arg.value] = str(path.relative_to(PACKAGE.parent))
    return found


def test_every_error_edge_is_exported_at_zero_before_its_first_error() -> None:
    registry = CollectorRegistry()
    SelfMetrics(registry, process_metrics=False)
    for where in ERROR_EDGES:
        assert registry.get_sample_value("archiver_errors_total", {"where": where}) == 0, where


def test_every_edge_the_code_counts_is_pre_created() -> None:
    """A new `metrics.error("x")` must be listed in ERROR_EDGES, else its first error never alerts."""
    counted = counted_edges()
    assert {"poll", "upload", "http", "manifest"} <= set(counted)  # the walk finds the calls
    missing = {where: path for where, path in counted.items() if where not in ERROR_EDGES}
    assert not missing, missing
    # The live engine reports its own edge's errors through SelfMetrics.live_capture.
    assert set(ERROR_EDGES) - set(counted) == {"live"}


def test_the_first_error_of_an_edge_moves_its_series_from_zero() -> None:
    registry = CollectorRegistry()
    metrics = SelfMetrics(registry, process_metrics=False)
    before = metrics.render(False)
    assert b'archiver_errors_total{where="fetch"} 0.0' in before
    metrics.error("fetch")
    assert registry.get_sample_value("archiver_errors_total", {"where": "fetch"}) == 1
    assert b'archiver_errors_total{where="fetch"} 1.0' in metrics.render(False)
