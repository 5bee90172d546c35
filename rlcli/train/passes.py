"""The learner's forward passes: which responses go through the model together, and how.

A `Pass` is one forward pass's input rows and, for each response token, the position whose
output predicts it. Two layouts: padded (`micro_batches`), a row per response, its prompt
left-padded and its response right-padded to the micro-batch's widest (the `Rollout`'s own
layout, trimmed); and shared prompts (`passes`, each built by `shared_prompt_pass`), a row per
group, its prompt once and then each of the group's responses, under an attention mask in which
every response sees the prompt and its own earlier tokens, not its siblings (docs/performance.md,
"What the learner does").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlcli.rollout.batch import Rollout
from rlcli.runtime import distributed

# A shared-prompt row grows only to this many tokens (unless one response alone is longer):
# the attention of a row costs its length squared, most of it masked between siblings.
ROW_TOKENS = 1024


@dataclass(frozen=True)
class Pass:
    """Input of one forward pass, and where each of its b responses' t tokens is predicted."""

    input_ids: Tensor  # [R, L]
    # [R, L] 1 on real tokens (padded layout), or [R, 1, L, L] which positions each position
    # attends to (shared prompts): bool for sdpa, additive float (0 or very negative) for eager,
    # a flex_attention BlockMask
    attention_mask: Tensor
    position_ids: Tensor  # [R, L]
    rows: Tensor  # [b, t] row of the position whose output predicts each response token
    cols: Tensor  # [b, t] ... and its column
    tokens: Tensor  # [b, t] the response tokens (padding beyond a response is never trained)
    real_tokens: int  # tokens of the pass that are not padding

    @staticmethod
    def padded(input_ids: Tensor, attention_mask: Tensor, prompt_width: int) -> Pass:
        """The padded layout: left-padded prompts of width `prompt_width`, then responses.
        Position ids follow the attention mask, so left padding does not shift positions."""
        b, width = input_ids.shape
        t = width - prompt_width
        cols = torch.arange(prompt_width - 1, width - 1, device=input_ids.device)
        return Pass(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0),
            rows=torch.arange(b, device=input_ids.device)[:, None].expand(b, t),
            cols=cols[None, :].expand(b, t),
            tokens=input_ids[:, prompt_width:],
            real_tokens=int(attention_mask.sum()),
        )


def plan_micro_batches(
    prompt_lengths: list[int], response_lengths: list[int], max_rows: int, max_tokens: int
) -> list[list[int]]:
    """Positions into the length lists, grouped into micro-batches.

    Rows are sorted by (response, prompt) length, so each micro-batch holds rows of similar
    length; a micro-batch takes at most `max_rows` rows and, padded to its longest prompt and
    response, at most `max_tokens` tokens (0 = no token limit; a single longer row goes alone).
    """
    order = sorted(
        range(len(prompt_lengths)), key=lambda i: (response_lengths[i], prompt_lengths[i])
    )
    plan: list[list[int]] = []
    current: list[int] = []
    widest_prompt = widest_response = 0
    for i in order:
        prompt = max(widest_prompt, prompt_lengths[i])
        response = max(widest_response, response_lengths[i], 1)
        too_many = len(current) == max_rows
        too_long = max_tokens > 0 and (len(current) + 1) * (prompt + response) > max_tokens
        if current and (too_many or too_long):
            plan.append(current)
            current, prompt, response = [], prompt_lengths[i], max(response_lengths[i], 1)
        current.append(i)
        widest_prompt, widest_response = prompt, response
    if current:
        plan.append(current)
    return plan


def response_spans(response_mask: Tensor) -> Tensor:
    """Columns up to each row's last trained token: its length, and with tools the tool turns
    inside it too (context the learner must read, though it does not train on them).  # [B]"""
    positions = torch.arange(1, response_mask.shape[1] + 1, device=response_mask.device)
    return (response_mask.long() * positions).amax(-1)


def micro_batches(batch: Rollout, rows: Tensor, size: int, max_tokens: int = 0):
    """Yield (rows, input_ids, attention_mask, prompt_width, response_mask) trimmed of padding,
    `rows` split by `plan_micro_batches`.

    Under torchrun every rank must run as many forward passes as the others (each one gathers
    the sharded weights): a rank with fewer micro-batches adds passes over one of its rows with
    an all-zero response mask, which add nothing to the loss or the diagnostics.
    """
    prompt_lengths = batch.attention_mask[rows, : batch.prompt_width].sum(-1).tolist()
    response_lengths = response_spans(batch.response_mask[rows]).tolist()
    plan = plan_micro_batches(prompt_lengths, response_lengths, size, max_tokens)
    parts = [(rows[positions], True) for positions in plan]
    spare = rows[:1] if len(rows) else torch.zeros(1, dtype=torch.long, device=rows.device)
    parts += [(spare, False)] * (distributed.all_max(len(plan)) - len(plan))
    for idx, counts in parts:
        att = batch.attention_mask[idx]
        mask = batch.response_mask[idx] if counts else torch.zeros_like(batch.response_mask[idx])
        # Drop columns that are padding in every row of this micro-batch.
        left = int((att[:, : batch.prompt_width].sum(0) == 0).long().cumprod(0).sum())
        width = max(int(response_spans(batch.response_mask[idx]).max()), 1)
        end = batch.prompt_width + width
        yield (
            idx,
            batch.input_ids[idx, left:end],
            att[:, left:end],
            batch.prompt_width - left,
            mask[:, :width],
        )


def plan_shared_rows(
    prompts: list[tuple[int, ...]], response_lengths: list[int], row_tokens: int = ROW_TOKENS
) -> list[list[int]]:
    """Positions into the lists, grouped into rows of responses to the same prompt (the same
    token ids): each row the prompt, then its responses shortest first while the row stays
    within `row_tokens` (a row always takes at least one)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(prompt, []).append(i)
    rows = []
    for prompt, members in groups.items():
        row, length = [], len(prompt)
        for i in sorted(members, key=lambda i: response_lengths[i]):
            if row and length + response_lengths[i] > row_tokens:
                rows.append(row)
                row, length = [], len(prompt)
            row.append(i)
            length += response_lengths[i]
        rows.append(row)
    return rows


def plan_shared_passes(
    row_lengths: list[int], row_sizes: list[int], max_responses: int, max_tokens: int
) -> list[list[int]]:
    """Positions into the row lists, grouped into passes: rows sorted by length, a pass taking
    at most `max_responses` responses and, padded to its longest row, `max_tokens` tokens
    (0 = no token limit; a row alone may exceed either)."""
    plan: list[list[int]] = []
    current: list[int] = []
    widest = responses = 0
    for r in sorted(range(len(row_lengths)), key=lambda r: row_lengths[r]):
        width = max(widest, row_lengths[r])
        too_many = responses + row_sizes[r] > max_responses
        too_long = max_tokens > 0 and (len(current) + 1) * width > max_tokens
        if current and (too_many or too_long):
            plan.append(current)
            current, width, responses = [], row_lengths[r], 0
        current.append(r)
        widest, responses = width, responses + row_sizes[r]
    if current:
        plan.append(current)
    return plan


def real_prompt(batch: HostRows | Rollout, i: int) -> Tensor:
    """Response i's prompt without its left padding."""
    width = batch.prompt_width
    return batch.input_ids[i, :width][batch.attention_mask[i, :width].bool()]


def pack_rows(
    lengths: list[int], sizes: list[int], capacity: int, max_responses: int
) -> list[list[int]]:
    """Positions into `lengths` and `sizes` (a group's row each: its prompt and responses, and
    how many responses), packed first-fit, longest first, into rows of at most `capacity`
    tokens and `max_responses` responses (a row that alone exceeds either stays alone)."""
    packed: list[list[int]] = []
    tokens_left: list[int] = []
    responses_left: list[int] = []
    for r in sorted(range(len(lengths)), key=lambda r: -lengths[r]):
        fits = (
            k
            for k in range(len(packed))
            if lengths[r] <= tokens_left[k] and sizes[r] <= responses_left[k]
        )
        k = next(fits, None)
        if k is None:
            packed.append([])
            tokens_left.append(capacity)
            responses_left.append(max_responses)
            k = len(packed) - 1
        packed[k].append(r)
        tokens_left[k] -= lengths[r]
        responses_left[k] -= sizes[r]
    return packed


def segment_mask(doc: Tensor, segment: Tensor) -> Tensor:
    """[R, L, L] which position (query) attends to which (key): the same group (`doc`), not
    later, and its group's prompt (segment 0) or its own response; padding attends to itself
    only, so that no row of the mask is empty (softmax of nothing)."""
    length = doc.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=doc.device).tril()
    same_group = doc[:, :, None] == doc[:, None, :]
    query, key = segment[:, :, None], segment[:, None, :]
    allowed = causal & same_group & (key >= 0) & ((key == 0) | (key == query))
    return allowed | torch.eye(length, dtype=torch.bool, device=doc.device)


def flex_block_mask(doc: Tensor, segment: Tensor):
    """`segment_mask` as a block mask for PyTorch's `flex_attention`, which computes only the
    blocks the mask leaves anything in (a group's prompt and its own responses) rather than
    every query against every key."""
    from torch.nn.attention.flex_attention import create_block_mask

    def allowed(b, h, q, kv):
        key = segment[b, kv]
        same = (doc[b, q] == doc[b, kv]) & (key >= 0) & ((key == 0) | (key == segment[b, q]))
        return ((q >= kv) & same) | (q == kv)

    rows, length = doc.shape
    return create_block_mask(allowed, rows, None, length, length, device=doc.device)


@dataclass(frozen=True)
class HostRows:
    """The token tables of a `Rollout` copied to the CPU once per `passes` call, so that a pass
    is laid out there, from many small writes, and moved to the device in a few copies; laid
    out on a GPU, each write is a kernel launch (thousands a step) and each read a sync."""

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    prompt_width: int

    @staticmethod
    def of(batch: Rollout) -> HostRows:
        cpu = torch.device("cpu")
        tables = (batch.input_ids, batch.attention_mask, batch.response_mask)
        return HostRows(*(t.to(cpu) for t in tables), batch.prompt_width)


def to_device(device: torch.device, *tensors: Tensor) -> list[Tensor]:
    """CPU tensors on `device`: on CUDA through pinned memory, without waiting for the copy."""
    if device.type != "cuda":
        return [t.to(device) for t in tensors]
    return [t.pin_memory().to(device, non_blocking=True) for t in tensors]


def shared_prompt_pass(
    batch: HostRows | Rollout,
    rows: list[list[list[int]]],
    spans: dict[int, int],
    prompt_of: dict[int, Tensor],
    attention: str,
    device: torch.device | None = None,
):
    """The pass over `rows`, each a list of groups (lists of response positions in `batch`
    sharing a prompt) laid one after the other; `spans[i]` the columns of response i the pass
    reads, `prompt_of[i]` its `real_prompt`; built where `batch` is, moved to `device`. Returns
    (the responses' positions in pass order [b], the Pass, their response mask [b, t]). A
    group reads P + sum(lengths) tokens, not G x P + sum(lengths): its prompt's outputs get all
    G responses' gradients (the padded layout's sum, up to rounding); groups packed in a row
    (`pack_rows`) attend only within themselves, so rows of unequal length need no padding."""
    width, host = batch.prompt_width, batch.input_ids.device
    device = device or host
    # The longest row: its groups' prompts and responses one after the other.
    length = max(sum(len(prompt_of[g[0]]) + sum(spans[i] for i in g) for g in row) for row in rows)
    order = [i for row in rows for group in row for i in group]
    t = max(1, max(spans[i] for i in order))
    ids = torch.zeros(len(rows), length, dtype=torch.long, device=host)
    positions = torch.zeros_like(ids)
    doc = torch.full_like(ids, -1)  # which group of its row a position belongs to
    segment = torch.full_like(ids, -1)  # 0 prompt, k the group's k-th response, -1 padding
    pred_rows = torch.zeros(len(order), t, dtype=torch.long, device=host)
    pred_cols, tokens = torch.zeros_like(pred_rows), torch.zeros_like(pred_rows)
    k = 0
    for r, row in enumerate(rows):
        col = 0
        for g, group in enumerate(row):
            prompt = prompt_of[group[0]]
            p, last = len(prompt), col + len(prompt) - 1  # the prompt's last position
            ids[r, col : col + p], positions[r, col : col + p] = prompt, torch.arange(p)
            segment[r, col : col + p], doc[r, col : col + p] = 0, g
            col += p
            for s, i in enumerate(group, 1):
                n = spans[i]
                response = batch.input_ids[i, width : width + n]
                real = batch.attention_mask[i, width : width + n]
                cols = slice(col, col + n)
                # As in the padded layout: positions count the real tokens before each one.
                ids[r, cols], positions[r, cols] = response, p - 1 + real.cumsum(0)
                segment[r, cols], doc[r, cols] = torch.where(real.bool(), s, -1), g
                # The first token is predicted by the prompt's last position, the others by
                # the response's own previous one.
                pred_rows[k], pred_cols[k, 0] = r, last
                pred_cols[k, 1:n] = torch.arange(col, col + max(n - 1, 0))
                tokens[k, :n] = response
                k, col = k + 1, col + n
    real_tokens = int((segment >= 0).sum())
    idx = torch.tensor(order, dtype=torch.long, device=host)
    response_mask = batch.response_mask[idx, :t]
    ids, positions, pred_rows, pred_cols, tokens, doc, segment, idx, response_mask = to_device(
        device, ids, positions, pred_rows, pred_cols, tokens, doc, segment, idx, response_mask
    )
    # The mask is made on the device from the two small tables: it is the pass's largest input.
    mask = attention_mask(doc, segment, attention)
    shared = Pass(ids, mask, positions, pred_rows, pred_cols, tokens, real_tokens)
    return idx, shared, response_mask


def attention_mask(doc: Tensor, segment: Tensor, attention: str):
    """`segment_mask` in the form the model's `attention` takes: a flex_attention block mask,
    booleans [R, 1, L, L] for sdpa, additive floats (0 or very negative) for eager attention,
    which adds the mask to its scores. The block mask (CUDA) skips the blocks a group does not
    see instead of computing and masking them."""
    if attention == "flex_attention":
        return flex_block_mask(doc, segment)
    mask = segment_mask(doc, segment)[:, None]
    if attention != "eager":
        return mask
    return torch.zeros(mask.shape, device=doc.device).masked_fill_(
        ~mask, torch.finfo(torch.float32).min
    )


def passes(batch: Rollout, rows: Tensor, size: int, max_tokens: int = 0, attention=None):
    """Yield (positions [b], Pass, response mask [b, t]) over the responses `rows` of `batch`:
    shared prompts where the model's `attention` implementation takes a custom mask ("eager",
    "sdpa", "flex_attention"), else the padded layout of `micro_batches`. `size` and
    `max_tokens` bound a pass's responses and padded tokens.

    Groups share a row where that costs nothing: with dense masks (eager, sdpa: attention
    costs a row's length squared) up to the longest group's length, which fills padding; with
    `flex_attention`, whose block mask skips what a group does not see, up to `max_tokens`
    (`ROW_TOKENS` without it). Under torchrun every rank runs as many passes (see
    `micro_batches`)."""
    if attention not in ("eager", "sdpa", "flex_attention"):
        for idx, ids, att, width, mask in micro_batches(batch, rows, size, max_tokens):
            yield idx, Pass.padded(ids, att, width), mask
        return
    device, batch = batch.input_ids.device, HostRows.of(batch)
    positions = rows.tolist()
    spans = dict(
        zip(positions, response_spans(batch.response_mask[positions]).tolist(), strict=True)
    )
    prompt_of = {i: real_prompt(batch, i) for i in positions}
    flex = attention == "flex_attention"
    row_tokens = max(max_tokens, ROW_TOKENS) if flex else ROW_TOKENS
    groups = [
        [positions[j] for j in row]
        for row in plan_shared_rows(
            [tuple(prompt_of[i].tolist()) for i in positions],
            [spans[i] for i in positions],
            row_tokens,
        )
    ]
    lengths = [len(prompt_of[group[0]]) + sum(spans[i] for i in group) for group in groups]
    sizes = [len(group) for group in groups]
    capacity = row_tokens if flex else max(lengths, default=0)
    packed = pack_rows(lengths, sizes, capacity, size)
    plan = plan_shared_passes(
        [sum(lengths[g] for g in row) for row in packed],
        [sum(sizes[g] for g in row) for row in packed],
        size,
        max_tokens,
    )
    for chosen in plan:
        row_groups = [[groups[g] for g in packed[r]] for r in chosen]
        yield shared_prompt_pass(batch, row_groups, spans, prompt_of, attention, device)
    for _ in range(distributed.all_max(len(plan)) - len(plan)):
        # A pass that adds nothing, for ranks with fewer passes than others.
        first = positions[:1] or [0]
        spans.setdefault(first[0], 0)
        prompt_of.setdefault(first[0], real_prompt(batch, first[0]))
        idx, spare, mask = shared_prompt_pass(batch, [[first]], spans, prompt_of, attention, device)
        yield idx, spare, torch.zeros_like(mask)
