"""Build the model's result as one JSON-able dict, and render it as text tables.

The table is rendered from the dict, so the two outputs cannot disagree.
"""

from __future__ import annotations

from dataclasses import replace

from perfmodel import budget as B
from perfmodel import levers as L
from perfmodel import paging as P

SCHEMA_VERSION = 1
ALPHA_BAND = (0.7, 0.75, 0.8, 0.85, 0.9)
BATCH_POINTS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def paging_rows(ms: list[int], trials: int, seed: int) -> list[dict]:
    """Seed formula vs exact closed form vs Monte-Carlo, for each M."""
    rows = []
    for m in ms:
        mc = P.monte_carlo_distinct(m, trials=trials, seed=seed + m) if trials else None
        exact = P.distinct_routed_exact(m)
        seed_f = P.distinct_seed(m)
        rows.append(
            {
                "m": m,
                "seed_formula": _r(seed_f),
                "exact_routed": _r(exact),
                "exact_routed_plus_shared": _r(exact + 1),
                "monte_carlo": _r(mc.mean) if mc else None,
                "monte_carlo_stderr": _r(mc.stderr, 4) if mc else None,
                "seed_over_exact": _r(seed_f / exact - 1, 4),
            }
        )
    return rows


def tree_block(inp: B.Inputs, acc: B.Acceptance, width: int) -> dict:
    """Cost of verifying a width-w tree instead of one chain, under each routing model."""
    chain = replace(inp, tree_width=1)
    tree = replace(inp, tree_width=width)
    ratios = {}
    for mode in B.ROUTING_MODES:
        c, t = replace(chain, routing=mode), replace(tree, routing=mode)
        ratios[mode] = _r(B.moe_ms(t) / B.moe_ms(c), 4)
    chain_ms, tree_ms = B.step_ms(chain), B.step_ms(tree)
    need = acc.mean_accept_len() * tree_ms / chain_ms
    return {
        "width": width,
        "tokens_verified_chain": chain.tokens_per_seq(),
        "tokens_verified_tree": tree.tokens_per_seq(),
        "moe_ratio": ratios,
        "step_ms_chain": _r(chain_ms),
        "step_ms_tree": _r(tree_ms),
        "step_ratio": _r(tree_ms / chain_ms, 4),
        "breakeven_accept_len": _r(need),
        "max_accept_len": inp.model.gamma + 1,
    }


def aggregate_rows(
    inp: B.Inputs, acc: B.Acceptance, max_num_seqs: int, per_seq_ms: float
) -> list[dict]:
    pts = sorted({b for b in BATCH_POINTS if b <= max_num_seqs} | {max_num_seqs})
    chain = replace(inp, tree_width=1)
    rows = []
    for b in pts:
        step = B.step_ms(chain, b, per_seq_ms)
        rows.append(
            {
                "num_seqs": b,
                "step_ms": _r(step),
                "moe_ms": _r(B.moe_ms(chain, b)),
                "aggregate_tok_s": _r(B.aggregate_tok_s(chain, acc, b, per_seq_ms)),
                "per_seq_tok_s": _r(acc.mean_accept_len() / step * 1e3),
                "roofline_tok_s": _r(B.aggregate_tok_s(chain, acc, b, 0.0)),
            }
        )
    return rows


def seats_for(inp: B.Inputs, acc: B.Acceptance, target: float, per_seq_ms: float) -> float | None:
    """Smallest (interpolated) batch whose aggregate reaches `target` tok/s."""
    prev = None
    for b in range(1, 257):
        v = B.aggregate_tok_s(inp, acc, b, per_seq_ms)
        if v >= target:
            if prev is None:
                return 1.0
            return b - 1 + (target - prev) / (v - prev)
        prev = v
    return None


def seed_checks(inp: B.Inputs) -> dict:
    """The seed's figures next to ours at the seed's own operating point."""
    s = inp.seed
    ref = B.Inputs(model=replace(inp.model, gamma=s.gamma), seed=s)
    acc = B.Acceptance.geometric(B.REF_ALPHA, s.gamma)
    uni = replace(ref, routing="uniform")
    bf16 = replace(ref, draft_head_fp8=False)
    per_seq = B.calibrated_per_seq_ms(ref)
    tree = tree_block(replace(ref, routing="seed"), acc, 2)
    return {
        "step_ms": {"seed": s.total_ms, "model": _r(B.step_ms(ref))},
        "steps_per_s": {
            "seed": s.steps_per_s,
            "model": _r(B.steps_per_s(ref)),
            "seed_steps_per_s_as_ms": _r(1e3 / s.steps_per_s),
        },
        "component_sum_ms": {
            "seed_listed": s.component_sum_ms(),
            "seed_total": s.total_ms,
            "residual": _r(B.residual_ms(ref)),
        },
        "tok_s_band": {
            "seed": [s.tok_s_low, s.tok_s_high],
            "alpha_for_low": _r(B.alpha_for_tok_s(ref, s.tok_s_low), 4),
            "alpha_for_high": _r(B.alpha_for_tok_s(ref, s.tok_s_high), 4),
        },
        "tree_width2_moe_ratio": {
            "seed": s.tree_ratio,
            "seed_formula": tree["moe_ratio"]["seed"],
            "exact_uniform": tree["moe_ratio"]["uniform"],
            "calibrated": tree["moe_ratio"]["calibrated"],
        },
        "moe_ms": {
            "seed": s.moe_ms,
            "uniform_routing_from_bytes": _r(B.moe_ms(uni)),
            "implied_distinct_per_layer": _r(B.implied_distinct_at_seed(ref)),
            "uniform_distinct_per_layer": _r(P.distinct_routed_exact(s.gamma + 1)),
            "routing_independence_rho": _r(B.routing_independence(ref), 4),
        },
        "heads_ms": {"seed": s.heads_ms, "model": _r(B.heads_ms(ref))},
        "fp8_draft_head_gain": {
            "seed": "+3-5%",
            "model": _r(B.step_ms(bf16) / B.step_ms(ref) - 1, 4),
        },
        "aggregate_ceiling": {
            "seed": s.ceiling_tok_s,
            "num_seqs": s.ceiling_num_seqs,
            "per_seq_ms_calibrated": _r(per_seq),
            "model": _r(B.aggregate_tok_s(ref, acc, s.ceiling_num_seqs, per_seq)),
            "seed_before": s.ceiling_before_tok_s,
            "num_seqs_for_before": _r(seats_for(ref, acc, s.ceiling_before_tok_s, per_seq), 2),
        },
    }


def build(
    inp: B.Inputs,
    acc: B.Acceptance,
    *,
    max_num_seqs: int,
    paging_ms: list[int],
    mc_trials: int,
    mc_seed: int,
    tree_width: int,
    per_seq_ms: float | None = None,
) -> dict:
    """Everything the CLI prints, as one dict (the `--json` document)."""
    per_seq = B.calibrated_per_seq_ms(inp) if per_seq_ms is None else per_seq_ms
    comps = B.components(inp)
    step = B.step_ms(inp)
    band = []
    for a in ALPHA_BAND:
        ga = B.Acceptance.geometric(a, inp.model.gamma)
        band.append(
            {"alpha": a, "mean_accept_len": _r(ga.mean_accept_len()), "tok_s": _r(B.tok_s(inp, ga))}
        )
    return {
        "schema_version": SCHEMA_VERSION,
        "inputs": {
            **B.as_dict(inp),
            "max_num_seqs": max_num_seqs,
            "mc_trials": mc_trials,
            "acceptance_conditional": list(acc.conditional),
        },
        "budget": [
            {
                "name": c.name,
                "ms": _r(c.ms),
                "share": _r(c.ms / step, 4),
                "source": c.source,
                "note": c.note,
            }
            for c in comps
        ],
        "step_ms": _r(step),
        "steps_per_s": _r(1e3 / step),
        "acceptance": {
            "conditional": [_r(p, 4) for p in acc.conditional],
            "per_position_rate": [_r(p, 4) for p in acc.rates()],
            "mean_accepted": _r(acc.mean_accepted()),
            "mean_accept_len": _r(acc.mean_accept_len()),
        },
        "tok_s": _r(B.tok_s(inp, acc)),
        "tok_s_band": band,
        "expert_paging": paging_rows(paging_ms, mc_trials, mc_seed),
        "tree": tree_block(inp, acc, tree_width),
        "aggregate": {
            "per_seq_ms": _r(per_seq),
            "per_seq_ms_source": "calibrated" if per_seq_ms is None else "flag",
            "ceiling_tok_s": _r(
                B.aggregate_tok_s(replace(inp, tree_width=1), acc, max_num_seqs, per_seq)
            ),
            "rows": aggregate_rows(inp, acc, max_num_seqs, per_seq),
        },
        "seed_checks": seed_checks(inp),
        "levers": L.build(inp, acc, per_seq),
    }


def _table(headers: list[str], rows: list[list]) -> str:
    cells = [
        [("" if v is None else (f"{v:g}" if isinstance(v, float) else str(v))) for v in r]
        for r in rows
    ]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = lambda r: "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True))  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])


def render(doc: dict) -> str:
    """Human-readable tables of the `build` document."""
    i, hw, m = doc["inputs"], doc["inputs"]["hw"], doc["inputs"]["model"]
    out = [
        f"DSV4-Flash DSpark on a GB10 pair: TP={m['tp']}, gamma={m['gamma']}, "
        f"BW={hw['bw_gbs']:g} GB/s, routing={i['routing']}, "
        f"draft head={'fp8' if i['draft_head_fp8'] else 'bf16'}, chain vs width-"
        f"{doc['tree']['width']} tree",
        "",
        "Per-verify-step budget (one rank)",
    ]
    out.append(
        _table(
            ["component", "ms", "share", "source", "how"],
            [
                [c["name"], round(c["ms"], 2), f"{c['share']:.0%}", c["source"], c["note"]]
                for c in doc["budget"]
            ],
        )
    )
    out.append(f"total {doc['step_ms']:.2f} ms/step -> {doc['steps_per_s']:.2f} verify steps/s")
    a = doc["acceptance"]
    out += [
        "",
        f"Acceptance: conditional {a['conditional']} -> per-position rate {a['per_position_rate']}",
        f"mean accepted {a['mean_accepted']:.3f}, "
        f"accept length {a['mean_accept_len']:.3f} -> single-stream {doc['tok_s']:.1f} tok/s",
        "",
        "Constant per-position acceptance alpha -> tok/s",
    ]
    out.append(
        _table(
            ["alpha", "accept_len", "tok/s"],
            [[b["alpha"], b["mean_accept_len"], round(b["tok_s"], 1)] for b in doc["tok_s_band"]],
        )
    )
    out += [
        "",
        "Distinct routed experts paged per layer when verifying M tokens (uniform top-6 of 256)",
    ]
    out.append(
        _table(
            [
                "M",
                "seed 256(1-(249/256)^M)",
                "exact 256(1-(250/256)^M)",
                "+shared",
                "Monte-Carlo",
                "+-se",
                "seed/exact-1",
            ],
            [
                [
                    r["m"],
                    r["seed_formula"],
                    r["exact_routed"],
                    r["exact_routed_plus_shared"],
                    r["monte_carlo"],
                    r["monte_carlo_stderr"],
                    f"{r['seed_over_exact']:+.1%}",
                ]
                for r in doc["expert_paging"]
            ],
        )
    )
    t = doc["tree"]
    out += [
        "",
        f"Width-{t['width']} tree: {t['tokens_verified_tree']} tokens verified vs "
        f"{t['tokens_verified_chain']}; MoE bytes x{t['moe_ratio']['seed']} (seed formula), "
        f"x{t['moe_ratio']['uniform']} (exact uniform), x{t['moe_ratio']['calibrated']} "
        f"(calibrated)",
        f"step {t['step_ms_chain']:.1f} -> {t['step_ms_tree']:.1f} ms "
        f"(x{t['step_ratio']}); to break even the tree must raise accept length to "
        f"{t['breakeven_accept_len']:.2f} (max {t['max_accept_len']})",
    ]
    g = doc["aggregate"]
    out += [
        "",
        f"Aggregate vs --max-num-seqs (per extra sequence {g['per_seq_ms']:.2f} ms, "
        f"{g['per_seq_ms_source']}; roofline = expert paging + all-reduce only)",
    ]
    out.append(
        _table(
            ["num_seqs", "step_ms", "moe_ms", "agg tok/s", "per-seq tok/s", "roofline tok/s"],
            [
                [
                    r["num_seqs"],
                    round(r["step_ms"], 1),
                    round(r["moe_ms"], 1),
                    round(r["aggregate_tok_s"], 1),
                    round(r["per_seq_tok_s"], 1),
                    round(r["roofline_tok_s"], 1),
                ]
                for r in g["rows"]
            ],
        )
    )
    out.append(f"ceiling at max-num-seqs {i['max_num_seqs']}: {g['ceiling_tok_s']:.1f} tok/s")
    out += ["", "Decode levers: this model's prediction beside the peers' measurements"]
    out.append(_table(["lever", "kind", "model", "peers measured"], lever_rows(doc["levers"])))
    if "group" in doc:
        out += ["", *group_lines(doc["group"])]
    out += ["", "Seed figures vs this model (at the seed's operating point, alpha=0.8)"]
    rows = []
    for k, v in doc["seed_checks"].items():
        rows.append([k, ", ".join(f"{kk}={vv}" for kk, vv in v.items())])
    out.append(_table(["check", "values"], rows))
    return "\n".join(out)


def _measured(m: dict) -> str:
    return f"{m['what']}: {m['before']:g} -> {m['after']:g} {m['unit']} ({m['change']:+.1%})"


def lever_rows(levers: list[dict]) -> list[list]:
    """One row per prediction, each beside the peers' figures (one per row, in order)."""
    rows: list[list] = []
    for lv in levers:
        m = lv["model"]
        if "rows" in m:
            model = [
                f"{r['num_seqs']} seq: verify {r['best_drafts']} of {m['gamma']} drafts, "
                f"{r['fixed_tok_s']:.1f} -> {r['best_tok_s']:.1f} tok/s ({r['change']:+.1%})"
                for r in m["rows"]
            ]
        else:
            model = [f"{m['tok_s'][0]:.1f} -> {m['tok_s'][1]:.1f} tok/s ({m['change']:+.1%})"]
        measured = [_measured(x) for x in lv["measured"]]
        for i in range(max(len(model), len(measured))):
            rows.append(
                [
                    lv["lever"] if i == 0 else "",
                    lv["kind"] if i == 0 else "",
                    model[i] if i < len(model) else "",
                    measured[i] if i < len(measured) else "",
                ]
            )
    return rows


def group_lines(g: dict) -> list[str]:
    """The TP=N block: the step at N beside TP=2, then per workload the peer's figures."""
    st = g["step_ms"]
    out = [
        f"TP={g['nodes']} on a {g['fabric']} fabric, {g['allreduce']} all-reduce: "
        f"{g['allreduces_per_step']} all-reduces x {g['allreduce_steps']} steps x "
        f"{g['hop_latency_us']:.1f} us + {g['bytes_share_per_link']:g} x "
        f"{g['message_bytes']} B per link",
        f"step {st['tp2']:.1f} ms (TP=2) -> {st['tpn']:.1f} ms: weights {st['weights_ms'][0]:.1f}"
        f" -> {st['weights_ms'][1]:.1f}, all-reduce {st['nccl_ms'][0]:.1f} -> "
        f"{st['nccl_ms'][1]:.1f}, other {st['other_ms']:.1f}; x{g['speedup']:.3f}",
        f"Single stream: predicted (accept length read off the peer's TP=2) vs measured "
        f"({g['peer']['source']})",
    ]
    rows = [
        [
            r["workload"],
            r["tp2_measured"],
            r["accept_len_from_tp2"],
            r["predicted"],
            r["measured"],
            r["ratio"],
        ]
        for r in g["versus_peer"]
    ]
    hdr = ["workload", "TP=2 measured", "accept len", "predicted", "measured", "ratio"]
    out.append(_table(hdr, rows))
    return out
