"""The decode's launch plan: which build (NARROW, WIDE, WIDE_LONG), how many splits of how many tokens a row, where
the full-precision window goes, which CTAs start first and how the partials merge, from a cost model of where each
SM's work ends (the timings behind each rule: docs/PERFORMANCE.md, The split plan)."""

from __future__ import annotations

import functools

from quant.kernels.common import DecodePlan, choose_split
from quant.kernels.cuda.loader import ROW_KERNEL_TOKENS


def row_kernel(tokens: int, splits: int, window_cta: bool, rotate_out: bool) -> bool:
    """Whether the decode launches decode_row_kernel (csrc/include/oscar_combine.cuh's row_kernel, the same rule)."""
    return not window_cta and splits == 1 and not rotate_out and tokens <= ROW_KERNEL_TOKENS


# The decode's builds, (min_blocks, warps): NARROW, CTAs of 4 warps, up to 3 an SM (two at batch 1, where each row has
# many splits); WIDE, CTAs of 8 warps, one an SM. At batch 1 an SM's two 4-warp CTAs end their loops apart (its older
# CTA's warps are issued first) and each writes a partial; one 8-warp CTA streams as fast as the two, and its row has
# half the partials to merge. WIDE loses where the rows fill the SMs and where a row's splits leave its 8 warps one or
# two groups each; it wins where a row has >= 16 SMs with 8 query rows a KV head, or >= 32 SMs, and for 4 query rows
# from WIDE_MIN_TOKENS (wide_plan; the timings behind each rule: docs/PERFORMANCE.md, The split plan). WIDE_LONG, CTAs
# of 12 warps, one an SM, takes WIDE's plans whose splits hold >= WIDE_LONG_SPLIT_TOKENS tokens (10+ groups a warp:
# three warps a scheduler hide more of the group step's latency than two; shorter splits leave its warps too few
# groups). Its CTAs hold one head tile (up to WIDE_LONG_MAX_QUERY_ROWS query rows a KV head: two tiles' ~250 registers
# a thread do not fit 12 warps in the register file). KernelOptions(wide_decode=False) keeps every launch on NARROW.
# Steps of up to a quarter as many rows as SMs whose rows are long (`long_rows`: LLaVA's 32 KV heads at 1 x 128K) take
# the wide builds too, in one wave of sms // rows splits a row: there NARROW's two CTAs an SM end apart and the SM
# idles through the second's tail, while one 12-warp CTA streams the same tokens to the end.
NARROW, WIDE, WIDE_LONG = (3, 4), (1, 8), (1, 12)


WIDE_MIN_TOKENS = 16384


WIDE_LONG_SPLIT_TOKENS = 4096


WIDE_LONG_MAX_QUERY_ROWS = 8


WIDE_LONG_ROW_TOKENS = 16384


def long_rows(tokens: int, rows: int, sms: int) -> bool:
    """Whether `rows` rows of `tokens` packed tokens fill one wave of one CTA an SM (at least 4 SMs a row) with splits
    of at least WIDE_LONG_ROW_TOKENS tokens (`decode_plan` then plans that wave for the wide builds)."""
    return 4 * rows <= sms and tokens >= WIDE_LONG_ROW_TOKENS * (sms // rows)


def wide_plan(tokens: int, rows: int, sms: int, query_rows: int = 1) -> bool:
    """Whether a step of `rows` (batch x KV heads) of `tokens` packed tokens, `query_rows` (GQA group x Lq) a row, takes
    the WIDE build: at least 32 SMs a row (the thinker's 4 KV heads at batch 1); or at least 16 SMs a row with 8 or
    more query rows (the thinker at batch 2) or >= WIDE_MIN_TOKENS tokens (Qwen3's 8 KV heads at batch 1 from 16K;
    shorter rows' splits leave 8 warps one or two groups each, and NARROW is faster); or `long_rows` of one head tile
    (their splits then run on WIDE_LONG, `wide_long`)."""
    return (
        rows * 32 <= sms
        or (rows * 16 <= sms and (query_rows >= 8 or tokens >= WIDE_MIN_TOKENS))
        or (query_rows <= WIDE_LONG_MAX_QUERY_ROWS and long_rows(tokens, rows, sms))
    )


def wide_long(split_tokens: int, query_rows: int) -> bool:
    """Whether a WIDE plan of splits of `split_tokens` tokens, `query_rows` a KV head, runs on WIDE_LONG's 12 warps."""
    return split_tokens >= WIDE_LONG_SPLIT_TOKENS and query_rows <= WIDE_LONG_MAX_QUERY_ROWS


def specialization(
    tokens: int,
    rows: int,
    sms: int,
    min_blocks: int | None = None,
    warps: int | None = None,
    query_rows: int = 1,
    wide: bool = True,
) -> tuple[int, int]:
    """(min_blocks, warps) of a launch: given ones stay (the other from NARROW), else WIDE where `wide` (the run's
    KernelOptions.wide_decode) and `wide_plan`, NARROW otherwise."""
    if min_blocks is None and warps is None:
        return WIDE if wide and wide_plan(tokens, rows, sms, query_rows) else NARROW
    return NARROW[0] if min_blocks is None else min_blocks, NARROW[1] if warps is None else warps


# A full-precision window token costs about as much as this many packed ones: its K and V are read as 2 x D 2-byte
# values, a packed token's as 3D/4 bytes (2-bit codes plus the fp16 scale and zero per 32 channels or tokens).
WINDOW_TOKEN_WEIGHT = 16 / 3


# Memoized: an eager step plans every layer's launch alike, and a plan takes microseconds of Python (_best_plan's
# search over split counts) that the step's host time would pay once per layer.
@functools.lru_cache(maxsize=4096)
def decode_plan(
    tokens: int, rows: int, sms: int, min_blocks: int = 3, residual: int = 0, window_cta: bool | None = None
) -> tuple[int, int, bool]:
    """The decode launch's plan: (split_tokens, num_splits, window_cta) for `rows` (batch x KV heads) of `tokens`
    packed tokens and `residual` window tokens on `sms` SMs with room for `min_blocks` CTAs each.

    A single wave is planned by where its slowest SM ends (`slowest_sm`): the block scheduler deals CTA i to the same SM
    as CTA i + sms, so a split count that puts three long CTAs on a few SMs while the rest hold two ends later than
    fewer splits that load every SM alike. While the rows fit one wave, plans of several waves compete too
    (`_best_plan`); beyond, `plan_splits`'s wave rule decides. A plan of a few waves in which the folded window would
    weigh >= 1/4 of a split gives the windows their own CTAs instead, started last (`waves_with_window`, `cta_order`),
    so that they fill the last wave's gaps instead of lengthening a split per row. A one-wave plan of two splits per row
    whose rows fill each SM's first slot makes the first split the longer and starts it first (`paired_splits`): an SM's
    first CTA runs ahead of its second.

    Where `separate_window` gives the window its own CTA, the best one-wave plan with the window folded competes too,
    and wins where its slowest SM ends sooner and its grid puts more than one CTA on an SM: at LLaVA 1 x 128K, fewer
    and longer splits two to an SM beat more splits plus window CTAs that put three on most SMs. Folded plans of one
    CTA an SM (8K tokens and less) lose to the window's own CTA, so they stay out. For the wide builds (min_blocks 1),
    `long_rows` take one wave of sms // rows splits, the window folded. The timings behind each rule:
    docs/PERFORMANCE.md, The split plan."""
    if min_blocks == 1 and long_rows(tokens, rows, sms):  # one wave, the window folded unless asked otherwise
        split = -(-tokens // (sms // rows * 128)) * 128
        return split, -(-tokens // split), bool(window_cta)
    slots = sms * min_blocks
    auto = window_cta is None
    if auto:
        window_cta = separate_window(rows, slots)
    room = max(slots - rows, rows) if window_cta else slots  # for the splits' CTAs
    window = 0 if window_cta else residual
    if tokens == 0 or rows > room:
        split, n = plan_splits(tokens, rows, room, window=window)
    else:
        split, n, window_cta, cost = _best_plan(tokens, rows, sms, room, -(-residual // 32) * 32, window_cta)
        if auto and window_cta:  # the window folded, where that wave's slowest SM ends sooner with > 1 CTA an SM
            folded = _best_plan(tokens, rows, sms, slots, -(-residual // 32) * 32, False)
            if folded[3] < cost - 1e-6 and (rows * folded[1] > sms or min_blocks == 1):
                split, n, window_cta = folded[:3]
    if (
        residual
        and tokens
        and rows * (n + window_cta) > slots
        and (window_cta or (auto and residual * WINDOW_TOKEN_WEIGHT >= split / 4 and rows * n <= 8 * slots))
    ):
        split, n = waves_with_window(tokens, rows, slots)
        window_cta = True
    if paired_splits(rows, n, window_cta, sms) and tokens > 256:
        split = paired_split_tokens(tokens, residual)
    return split, n, window_cta


def plan_launch(
    tokens: int,
    rows: int,
    sms: int,
    query_rows: int,
    residual: int,
    min_blocks: int | None = None,
    warps: int | None = None,
    wide: bool = True,
    window_cta: bool | None = None,
    split_tokens: int | None = None,
    waves: float | None = None,
) -> tuple[int, int, int, int, bool]:
    """The planner's launch, (min_blocks, warps, split_tokens, num_splits, window_cta): the build (`specialization`;
    a WIDE plan of long splits moves to WIDE_LONG, `wide_long`, unless the caller gave the build) and its split plan:
    the given split_tokens (the window as given), a plan of `waves` waves of the resident CTAs (`choose_split`), or
    `decode_plan`'s; a planned one within the merge's 1024 partials a row."""
    chosen = min_blocks is None and warps is None
    min_blocks, warps = specialization(tokens, rows, sms, min_blocks, warps, query_rows, wide)
    if split_tokens is not None:
        splits = -(-tokens // split_tokens) if tokens else 0
    else:
        if waves is not None:
            slots = sms * min_blocks
            window_cta = separate_window(rows, slots) if window_cta is None else window_cta
            split_tokens, splits = choose_split(
                tokens, rows, 128, max(slots - rows, rows) if window_cta else slots, waves
            )
        else:
            split_tokens, splits, window_cta = decode_plan(tokens, rows, sms, min_blocks, residual, window_cta)
        while splits + 1 > 1024:  # the merge's limit
            split_tokens *= 2
            splits = -(-tokens // split_tokens)
    if chosen and (min_blocks, warps) == WIDE and wide_long(split_tokens, query_rows):
        min_blocks, warps = WIDE_LONG
    return min_blocks, warps, split_tokens, splits, window_cta


@functools.lru_cache(maxsize=4096)
def make_plan(
    tokens: int,
    rows: int,
    sms: int,
    query_rows: int,
    residual: int,
    head_dim: int,
    min_blocks: int | None = None,
    warps: int | None = None,
    wide: bool = True,
    window_cta: bool | None = None,
    split_tokens: int | None = None,
    waves: float | None = None,
    order: int | None = None,
    merge_group: int | None = None,
    invariant: bool = False,
) -> DecodePlan:
    """The decode launch's DecodePlan for `rows` (batch x KV heads) of `tokens` packed and `residual` window tokens,
    `query_rows` (GQA group x Lq) a row, on `sms` SMs: `plan_launch`'s build and splits, `cta_order`'s order and
    `merge_plan`'s merge; each given argument overrides the planner's choice (as `decode_attention` documents them).
    invariant (the batch-invariant mode): a plan that depends on no other row: the NARROW build, splits of
    INVARIANT_SPLIT_TOKENS (a row's splits past its length are empty and merge as exact zeros), the window in its own
    CTA and a one-level merge, whose accumulators take the splits in the same order whatever their count. Memoized:
    every layer of a step, and every step of a length, plans alike."""
    if invariant:
        from quant.kernels import INVARIANT_SPLIT_TOKENS

        min_blocks, warps = NARROW
        split_tokens = split_tokens or INVARIANT_SPLIT_TOKENS
        window_cta, merge_group, order = True, 0, ORDER_ROWS
    min_blocks, warps, split_tokens, splits, window_cta = plan_launch(
        tokens, rows, sms, query_rows, residual, min_blocks, warps, wide, window_cta, split_tokens, waves
    )
    if warps > 8 and query_rows > WIDE_LONG_MAX_QUERY_ROWS:
        raise ValueError(
            f"a {warps}-warp decode build holds up to {WIDE_LONG_MAX_QUERY_ROWS} query rows per KV head, got "
            f"{query_rows}: use warps=4 or 8"
        )
    window_cta = bool(window_cta)
    if order is None:
        order = cta_order(rows, splits, window_cta, sms * min_blocks, sms)
    elif order not in (ORDER_ROWS, ORDER_SPECIAL_FIRST, ORDER_SPECIAL_LAST):
        raise ValueError(
            f"order must be {ORDER_ROWS} (row by row), {ORDER_SPECIAL_FIRST} (each row's window or "
            f"window-carrying CTA first) or {ORDER_SPECIAL_LAST} (those last), got {order!r}"
        )
    if merge_group is None:
        merge_group = merge_plan(splits, query_rows, head_dim, window_cta, 32 * warps)
    elif merge_group < 0:
        raise ValueError(f"merge_group must be >= 0, got {merge_group}")
    return DecodePlan(tokens, rows, splits, split_tokens, window_cta, order, merge_group, min_blocks, warps)


def waves_with_window(tokens: int, rows: int, slots: int, most: int = 8) -> tuple[int, int]:
    """A plan of several waves in which each row's window has its own CTA, started after every split (`cta_order`):
    the splits' count whose CTAs plus the windows' fill their waves best (ties: fewer). The block scheduler hands
    freed slots the next CTA, so the short window CTAs fill the last wave's gaps instead of lengthening one split
    per row. `decode_plan` takes it when a folded window would weigh >= 1/4 of a split and the grid is a few waves
    (Qwen3 64 x 4K), and only if the windows start last: in row order they lengthen the step instead. Where the
    window is light against a split (batches at 128K), or over many waves, where the scheduler evens the CTAs out
    anyway, folding stays: the extra CTAs cost about what they save or more (docs/PERFORMANCE.md, The split plan)."""

    def busy(s):
        ctas = rows * (s + 1)
        return ctas / (-(-ctas // slots) * slots)

    want = max(range(1, most + 1), key=lambda s: (round(busy(s), 3), -s))
    split = max(128, -(-tokens // (want * 128)) * 128)
    return split, -(-tokens // split)


# A CTA's fixed cost (query load, partial write and arrival) in packed tokens streamed meanwhile, and the speed of an
# SM holding one CTA against two or three: one CTA cannot keep enough loads in flight to stream at the SM's share
# (the figures these come from: docs/PERFORMANCE.md, The split plan).
CTA_COST_TOKENS = 480


ONE_CTA_SM_SPEED = 0.86


def cta_costs(tokens: int, split: int, splits: int, window_cta: bool, residual: int) -> list[float]:
    """One row's CTAs in launch order (blockIdx.x) and their work in packed tokens: the window CTA (window_cta) and
    then the splits, each costing its tokens (the window's weighed by WINDOW_TOKEN_WEIGHT, in its own CTA or the last
    split's) plus CTA_COST_TOKENS."""
    win = residual * WINDOW_TOKEN_WEIGHT
    row = [win + CTA_COST_TOKENS] if window_cta else []
    for i in range(splits):
        last_win = win if not window_cta and i == splits - 1 else 0
        row.append(min(split, tokens - i * split) + CTA_COST_TOKENS + last_win)
    return row


def slowest_sm(tokens: int, rows: int, split: int, splits: int, sms: int, window_cta: bool, residual: int) -> float:
    """Work of the most loaded SM, in packed tokens, when the grid is one wave and CTA i runs on SM i mod sms (rows
    in blockIdx.y, each row's CTAs as `cta_costs`); an SM with one CTA is slower."""
    load, count = [0.0] * sms, [0] * sms
    for i, cost in enumerate(cta_costs(tokens, split, splits, window_cta, residual) * rows):
        load[i % sms] += cost
        count[i % sms] += 1
    return max(w / (ONE_CTA_SM_SPEED if c == 1 else 1.0) for w, c in zip(load, count))


def waves_cost(costs: list[float], sms: int, per_sm: int) -> float:
    """Work of the slowest SM, in packed tokens, for a grid of more CTAs than resident slots (sms * per_sm): each
    wave of `slots` CTAs (a partial last one too) costs per_sm of the longest CTA. A partial last wave ends as late as
    a full one (docs/PERFORMANCE.md, The split plan), so the plans this picks among are the fullest (`plan_splits`'
    busy rule)."""
    slots = sms * per_sm
    return -(-len(costs) // slots) * per_sm * max(costs)


# Among one-wave plans the cost model ties (short steps, where the window's own CTA is the costliest in packed tokens
# whatever the split count), the most splits up to this: shorter splits end the step sooner, and up to 16 partials a
# row one merge round takes them all.
TIE_MOST_SPLITS = 16


@functools.lru_cache(maxsize=256)
def _best_plan(tokens: int, rows: int, sms: int, room: int, residual: int, window_cta: bool):
    """The cheaper of the best one-wave plan (`slowest_sm` over every split count that fits one wave) and, when up
    to 8 splits can overfill it, the several-wave plan whose last wave is fullest (`waves_cost`); ties go to one
    wave. Several waves win when the rows slightly exceed the SMs (batches of 14-17 sequences at 128K: one wave holds
    too few splits a row to load the SMs evenly), not where one wave already does (10 x 128K, 16 x 32K); the timings:
    docs/PERFORMANCE.md, The split plan. One-wave ties: TIE_MOST_SPLITS."""
    window = 0 if window_cta else residual
    best = None
    for want in range(1, min(room // rows, -(-tokens // 128)) + 1):
        split, n = plan_splits(tokens, rows, room, window=window, want=want)
        cost = slowest_sm(tokens, rows, split, n, sms, window_cta, residual)
        # ties (the window CTA's weight bounds every count, at short contexts): the most splits up to TIE_MOST_SPLITS
        if best is None or cost < best[0] - 1e-6 or (cost < best[0] + 1e-6 and best[2] < n <= TIE_MOST_SPLITS):
            best = (cost, split, n)
    over = [w for w in range(room // rows + 1, min(8, -(-tokens // 128)) + 1)]
    if over:

        def busy(w):
            ctas = rows * w
            return ctas / (-(-ctas // room) * room)

        want = max(over, key=lambda w: (round(busy(w), 3), -w))
        split, n = plan_splits(tokens, rows, room, window=window, want=want)
        cost = waves_cost(cta_costs(tokens, split, n, window_cta, residual) * rows, sms, max(1, room // sms))
        if best is None or cost < best[0] - 1e-6:
            best = (cost, split, n)
    return best[1], best[2], window_cta, best[0]


def plan_splits(
    tokens: int, rows: int, slots: int, block: int = 128, most: int = 8, window: int = 0, want: int | None = None
) -> tuple[int, int]:
    """Split-KV plan for the CUDA kernel: (split_tokens, num_splits). One CTA per (split, row), the window
    folded into one of them, so the grid is rows * splits CTAs over `slots` resident ones. Up to one wave:
    fill it (splits = slots // rows; `decode_plan` chooses among the counts by their slowest SM); beyond: the
    splits (<= `most`) whose CTAs fill the waves they need best (ties: fewer splits), e.g. 512 rows on 396 slots
    -> 3 splits (3.9 of 4 waves busy); `want` forces the count. window: full-precision tokens the last split's CTA also
    attends to; in a single wave, where the slowest CTA ends the step, the splits are sized as if the row held their
    weight in packed tokens too, so that split comes out shorter by about that much and ends with the others; over
    several waves the scheduler evens the CTAs out and longer splits only cost (docs/PERFORMANCE.md, The split
    plan)."""
    if tokens == 0:
        return block, 0
    if want is None and rows <= slots:
        want = slots // rows
    elif want is None:

        def busy(s):
            ctas = rows * s
            return ctas / (-(-ctas // slots) * slots)

        want = max(range(1, most + 1), key=lambda s: (round(busy(s), 3), -s))
    weighted = tokens + (round(window * WINDOW_TOKEN_WEIGHT) if rows * want <= slots else 0)
    split = max(block, -(-weighted // (want * block)) * block)
    return split, -(-tokens // split)


# The kernel's CTA orders (DecodeParams::order): which CTAs the block scheduler starts first.
ORDER_ROWS, ORDER_SPECIAL_FIRST, ORDER_SPECIAL_LAST = 0, 1, 2


def cta_order(rows: int, splits: int, window_cta: bool, slots: int, sms: int | None = None) -> int:
    """The launch order of a plan. The block scheduler starts CTAs in linear order and, over several waves, hands
    each freed slot the next one (a list schedule). A several-wave plan with the windows in their own CTAs starts
    them last, so that the short window CTAs fill the last wave's gaps (`waves_with_window`). A plan of `paired_splits`
    starts the window-carrying last splits last too: each SM's first CTA is a row's longer first split. Everything
    else goes row by row: the planner's `slowest_sm` model of one wave deals CTA i to SM i mod SMs in that order, and
    starting the window-carrying last splits first is slower at 64 x 4K and no better at 14-17 x 128K
    (docs/PERFORMANCE.md, The split plan). sms: the device's SMs (default slots / 3)."""
    if window_cta and splits >= 1 and rows * (splits + 1) > slots:
        return ORDER_SPECIAL_LAST
    if paired_splits(rows, splits, window_cta, slots // 3 if sms is None else sms):
        return ORDER_SPECIAL_LAST
    return ORDER_ROWS


# An SM's first CTA ends before its second (its warps are issued first): with two splits a row, the first split (the
# SM's first CTA) is made longer by this factor than the second, which holds the window, so both end together.
FIRST_CTA_SHARE = 1.08


def paired_splits(rows: int, splits: int, window_cta: bool, sms: int) -> bool:
    """A one-wave plan of two splits per row, the window folded, each row's first split the first CTA of its SM and
    its last split the second CTA of another (rows <= SMs < 2 rows, `cta_order` starting the last splits last)."""
    return not window_cta and splits == 2 and rows <= sms < 2 * rows


def paired_split_tokens(tokens: int, residual: int) -> int:
    """The first split's tokens in a `paired_splits` plan: FIRST_CTA_SHARE times the second's, whose work includes
    the folded window (weighed by WINDOW_TOKEN_WEIGHT); a multiple of 128, two splits still."""
    weighted = tokens + residual * WINDOW_TOKEN_WEIGHT
    split = round(weighted * FIRST_CTA_SHARE / (1 + FIRST_CTA_SHARE) / 128) * 128
    return min(max(split, -(-tokens // 256) * 128), -(-tokens // 128) * 128 - 128)


def separate_window(rows: int, slots: int) -> bool:
    """Whether the window gets its own CTA: it runs once per step from a cold instruction cache, the slower the more
    DRAM traffic the splits make beside it (docs/PERFORMANCE.md, The split plan), so off the splits' critical path it is
    hidden, but it takes a resident slot per row: worth it when one wave holds the window CTAs beside >= 8 splits per
    row (batch-1 steps), not for batched steps. `decode_plan` still weighs the folded plan against it."""
    return rows * 9 <= slots


def merge_plan(splits: int, rows: int, head_dim: int, window_cta: bool, threads: int = 128) -> int:
    """merge_group of the decode launch: 0 (the last CTA of a row merges every partial) or G (two levels: the last CTA
    of each group of G quantized splits merges the group, then the row's last CTA merges the groups and the window).
    rows = (Hq / Hkv) * Lq query rows per KV head; threads: of the CTA. A merging thread keeps 8 partials' loads in
    flight and threads / (head_dim / 8) rows' threads share the work, so one CTA merges per round of L2 latency
    G = 8 * max(1, threads_per_pass / rows) partials; two levels are used where one would take more than four such
    rounds (the Qwen3-Omni thinker at 1 x 128K: 64 splits of 8 rows, 8 rounds), and need the window in its own CTA.
    At four rounds one level wins: the second level costs more after a read-only flush than it saves after a dirty
    one; at eight it pays (docs/PERFORMANCE.md, The split plan)."""
    per_round = 8 * max(1, (threads // (head_dim // 8)) // max(rows, 1))
    return per_round if window_cta and splits > 4 * per_round else 0
