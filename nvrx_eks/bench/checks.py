"""The acceptance checks `nvrx-eks bench` records with its results: each scenario's claim, whether
this machine's numbers meet it, and the numbers that say so."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nvrx_eks.bench.tables import format_ms

#: A claim's verdict on its scenario's results: (met, the numbers that say so).
Verdict = tuple[bool, str]


@dataclass(frozen=True)
class Claim:
    scenario: str  # the result's key the claim reads ("p1" ...), checked when the scenario ran
    condition: str
    judge: Callable[[dict[str, Any]], Verdict]


def _check(condition: str, ok: bool, measured: str) -> dict[str, Any]:
    return {"condition": condition, "ok": bool(ok), "measured": measured}


def acceptance_checks(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every claim of the scenarios that ran, in CLAIMS' order, then that no process was left."""
    checks = [_check(c.condition, *c.judge(result[c.scenario])) for c in CLAIMS if c.scenario in result]
    return [*checks, _check("no process left behind", *_no_process_left(result["processes"]))]


def _stalls(p1: dict[str, Any]) -> tuple[float, float, float]:
    """The median stalls of nvrx, sync and dcp-async."""
    by = {b["backend"]: b for b in p1["backends"]}
    nvrx, sync, dcp = (by[b]["handoff_s"] for b in ("nvrx", "sync", "dcp-async"))
    return nvrx, sync, dcp


def _nvrx_vs_sync(p1: dict[str, Any]) -> Verdict:
    nvrx, sync, _ = _stalls(p1)
    return sync >= 5 * nvrx, f"sync {sync * 1000:.0f} ms / nvrx {nvrx * 1000:.0f} ms = {sync / nvrx:.1f}x"


def _nvrx_vs_dcp_async(p1: dict[str, Any]) -> Verdict:
    nvrx, _, dcp = _stalls(p1)
    return nvrx <= dcp, f"nvrx {nvrx * 1000:.0f} ms, dcp-async {dcp * 1000:.0f} ms"


def _ft_launcher_vs_relaunch(p3: dict[str, Any]) -> Verdict:
    ft, full = p3["ft_launcher"]["medians"]["first_step_s"], p3["full_relaunch"]["medians"]["first_step_s"]
    return full > ft, f"first step after the fault: {ft:.1f} s vs {full:.1f} s (ratio {full / ft:.2f}x)"


def _layered_vs_baseline(p4: dict[str, Any]) -> Verdict:
    layered, baseline = p4["layered"]["goodput"], p4["baseline"]["goodput"]
    return layered > baseline, f"{layered:.1%} vs {baseline:.1%}"


def _tier_replays_less(p5: dict[str, Any]) -> Verdict:
    tiers, fsx = p5["tiers"], p5["fsx_only"]
    return (
        tiers["lost_steps"] < fsx["lost_steps"],
        f"{tiers['lost_steps']} vs {fsx['lost_steps']} at FSx every {p5['fsx_interval']} steps",
    )


def _tier_goodput(p5: dict[str, Any]) -> Verdict:
    tiers, fsx = p5["tiers"], p5["fsx_only"]
    return tiers["goodput"] > fsx["goodput"], f"{tiers['goodput']:.1%} vs {fsx['goodput']:.1%}"


def _tier_stall_vs_floor(p5: dict[str, Any]) -> Verdict:
    ratio = p5["local_stall_floor_ratio"]
    return (
        ratio is not None and ratio <= 1.5,
        f"{format_ms(p5['tiers']['local_stall_s'])} vs floor {format_ms(p5['floor']['copy_s'])}"
        + (f" = {ratio:.2f}x" if ratio else ""),
    )


def _tier_restore_vs_fsx(p5: dict[str, Any]) -> Verdict:
    tiers, fsx = p5["tiers"], p5["fsx_only"]
    ratio = p5["restore_ratio"]
    return (
        ratio is not None and ratio >= 2,
        f"median {format_ms(tiers['restore_s']['local'])} vs {format_ms(fsx['restore_s']['fsx'])}"
        + (f" = {ratio:.1f}x" if ratio else "")
        + f"; reading the tier {format_ms(tiers['restore_read_s']['local'])}"
        + f" vs {format_ms(fsx['restore_read_s']['fsx'])}",
    )


def _tiers_bit_identical(p5: dict[str, Any]) -> Verdict:
    tiers, fsx = p5["tiers"], p5["fsx_only"]
    return p5["bit_identical"], f"state_sha256 {tiers['state_sha256'][:12]}… vs {fsx['state_sha256'][:12]}…"


def _spare_vs_ft_launcher(p6: dict[str, Any]) -> Verdict:
    a, b = p6["spare_inprocess"]["recovery"]["first_step_s"], p6["ft_launcher"]["recovery"]["first_step_s"]
    return b >= 3 * a, f"{a:.1f} s vs {b:.1f} s ({b / a:.1f}x)"


def _spare_vs_hot_spare_node(p6: dict[str, Any]) -> Verdict:
    a = p6["spare_node_loss"]["recovery"]["first_step_s"]
    d = p6["ft_hot_spare_node_loss"]["recovery"]["first_step_s"]
    return a < d, f"{a:.1f} s vs {d:.1f} s ({d / a:.1f}x)"


def _spares_bit_identical(p6: dict[str, Any]) -> Verdict:
    return p6["bit_identical"], "state_sha256 compared"


def _gloo_release_recovers(p7: dict[str, Any]) -> Verdict:
    after = p7["release"]["after_detect_s"]
    return after is not None and after <= 3, f"{after:.1f} s vs {p7['no_release']['after_detect_s']:.1f} s without"


def _no_process_left(processes: dict[str, Any]) -> Verdict:
    clean = not processes["alive_after"] and not processes["killed_after_exit"]
    return clean, (
        "none" if clean else f"alive {processes['alive_after']}, had to be killed {processes['killed_after_exit']}"
    )


#: Each scenario's claims, in the order the acceptance table lists them.
CLAIMS = (
    Claim("p1", "P1: nvrx median stall at least 5x smaller than sync", _nvrx_vs_sync),
    Claim("p1", "P1: nvrx median stall no larger than dcp-async", _nvrx_vs_dcp_async),
    Claim("p3", "P3: ft_launcher recovery faster than a full relaunch", _ft_launcher_vs_relaunch),
    Claim("p4", "P4: layered goodput beats the baseline", _layered_vs_baseline),
    Claim("p5", "P5: fewer steps replayed with the local tier", _tier_replays_less),
    Claim("p5", "P5: goodput with the local tier beats FSx alone", _tier_goodput),
    Claim("p5", "P5: local-tier stall per save within 1.5x the copy floor", _tier_stall_vs_floor),
    Claim("p5", "P5: a restore from the local tier at least 2x faster than from FSx", _tier_restore_vs_fsx),
    Claim("p5", "P5: both sides end bit-identical", _tiers_bit_identical),
    Claim("p6", "P6: a spare in process at least 3x faster to the first step than ft_launcher", _spare_vs_ft_launcher),
    Claim(
        "p6",
        "P6: a lost node replaced faster by a spare in process than by ft_launcher's hot-spare node",
        _spare_vs_hot_spare_node,
    ),
    Claim("p6", "P6: every side ends bit-identical", _spares_bit_identical),
    Claim("p7", "P7: exception recovered within 3 s of detection with the gloo release", _gloo_release_recovers),
)
