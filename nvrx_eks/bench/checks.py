"""The acceptance checks `nvrx-eks bench` records with its results: each scenario's claim, whether
this machine's numbers meet it, and the numbers that say so."""

from __future__ import annotations

from typing import Any

from nvrx_eks.bench.tables import format_ms


def _check(condition: str, ok: bool, measured: str) -> dict[str, Any]:
    return {"condition": condition, "ok": bool(ok), "measured": measured}


def acceptance_checks(result: dict[str, Any]) -> list[dict[str, Any]]:
    checks = []
    if "p1" in result:
        by = {b["backend"]: b for b in result["p1"]["backends"]}
        nvrx, sync, dcp = (by[b]["handoff_s"] for b in ("nvrx", "sync", "dcp-async"))
        checks.append(
            _check(
                "P1: nvrx median stall at least 5x smaller than sync",
                sync >= 5 * nvrx,
                f"sync {sync * 1000:.0f} ms / nvrx {nvrx * 1000:.0f} ms = {sync / nvrx:.1f}x",
            )
        )
        checks.append(
            _check(
                "P1: nvrx median stall no larger than dcp-async",
                nvrx <= dcp,
                f"nvrx {nvrx * 1000:.0f} ms, dcp-async {dcp * 1000:.0f} ms",
            )
        )
    if "p3" in result:
        p3 = result["p3"]
        ft, full = p3["ft_launcher"]["medians"]["first_step_s"], p3["full_relaunch"]["medians"]["first_step_s"]
        checks.append(
            _check(
                "P3: ft_launcher recovery faster than a full relaunch",
                full > ft,
                f"first step after the fault: {ft:.1f} s vs {full:.1f} s (ratio {full / ft:.2f}x)",
            )
        )
    if "p4" in result:
        layered, baseline = result["p4"]["layered"]["goodput"], result["p4"]["baseline"]["goodput"]
        checks.append(
            _check("P4: layered goodput beats the baseline", layered > baseline, f"{layered:.1%} vs {baseline:.1%}")
        )
    if "p5" in result:
        p5 = result["p5"]
        tiers, fsx = p5["tiers"], p5["fsx_only"]
        checks.append(
            _check(
                "P5: fewer steps replayed with the local tier",
                tiers["lost_steps"] < fsx["lost_steps"],
                f"{tiers['lost_steps']} vs {fsx['lost_steps']} at FSx every {p5['fsx_interval']} steps",
            )
        )
        checks.append(
            _check(
                "P5: goodput with the local tier beats FSx alone",
                tiers["goodput"] > fsx["goodput"],
                f"{tiers['goodput']:.1%} vs {fsx['goodput']:.1%}",
            )
        )
        ratio = p5["local_stall_floor_ratio"]
        checks.append(
            _check(
                "P5: local-tier stall per save within 1.5x the copy floor",
                ratio is not None and ratio <= 1.5,
                f"{format_ms(tiers['local_stall_s'])} vs floor {format_ms(p5['floor']['copy_s'])}"
                + (f" = {ratio:.2f}x" if ratio else ""),
            )
        )
        restore_ratio = p5["restore_ratio"]
        checks.append(
            _check(
                "P5: a restore from the local tier at least 2x faster than from FSx",
                restore_ratio is not None and restore_ratio >= 2,
                f"median {format_ms(tiers['restore_s']['local'])} vs {format_ms(fsx['restore_s']['fsx'])}"
                + (f" = {restore_ratio:.1f}x" if restore_ratio else "")
                + f"; reading the tier {format_ms(tiers['restore_read_s']['local'])}"
                + f" vs {format_ms(fsx['restore_read_s']['fsx'])}",
            )
        )
        checks.append(
            _check(
                "P5: both sides end bit-identical",
                p5["bit_identical"],
                f"state_sha256 {tiers['state_sha256'][:12]}… vs {fsx['state_sha256'][:12]}…",
            )
        )
    if "p6" in result:
        p6 = result["p6"]
        a, b = p6["spare_inprocess"]["recovery"]["first_step_s"], p6["ft_launcher"]["recovery"]["first_step_s"]
        checks.append(
            _check(
                "P6: a spare in process at least 3x faster to the first step than ft_launcher",
                b >= 3 * a,
                f"{a:.1f} s vs {b:.1f} s ({b / a:.1f}x)",
            )
        )
        a = p6["spare_node_loss"]["recovery"]["first_step_s"]
        d = p6["ft_hot_spare_node_loss"]["recovery"]["first_step_s"]
        checks.append(
            _check(
                "P6: a lost node replaced faster by a spare in process than by ft_launcher's hot-spare node",
                a < d,
                f"{a:.1f} s vs {d:.1f} s ({d / a:.1f}x)",
            )
        )
        checks.append(_check("P6: every side ends bit-identical", p6["bit_identical"], "state_sha256 compared"))
    if "p7" in result:
        after = result["p7"]["release"]["after_detect_s"]
        checks.append(
            _check(
                "P7: exception recovered within 3 s of detection with the gloo release",
                after is not None and after <= 3,
                f"{after:.1f} s vs {result['p7']['no_release']['after_detect_s']:.1f} s without",
            )
        )
    left = result["processes"]
    checks.append(
        _check(
            "no process left behind",
            not left["alive_after"] and not left["killed_after_exit"],
            "none"
            if not left["alive_after"] and not left["killed_after_exit"]
            else f"alive {left['alive_after']}, had to be killed {left['killed_after_exit']}",
        )
    )
    return checks
