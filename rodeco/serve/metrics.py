"""``GET /metrics``: the server's Prometheus metrics, in a registry of its own (two servers in one process, as in the
tests, do not share counters)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80, 160, 320)
COUNT_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "rodeco_requests", "requests answered, by endpoint and status", ["endpoint", "status"], registry=r
        )
        self.queue_depth = Gauge("rodeco_queue_depth", "requests waiting for a batch", registry=r)
        self.batch_requests = Gauge("rodeco_batch_requests", "requests in the batch decoding now", registry=r)
        self.batch_rows = Gauge("rodeco_batch_rows", "candidate rows in the batch decoding now", registry=r)
        self.admissions = Counter("rodeco_admissions", "requests admitted into the running batch", registry=r)
        self.step_requests = Histogram(
            "rodeco_step_requests", "requests in the batch, per stretch of decoding", buckets=COUNT_BUCKETS, registry=r
        )
        self.step_rows = Histogram(
            "rodeco_step_rows",
            "candidate rows in the batch, per stretch of decoding",
            buckets=COUNT_BUCKETS,
            registry=r,
        )
        self.budget = Gauge("rodeco_kv_budget_tokens", "the server's KV budget in tokens (-1: unlimited)", registry=r)
        self.peak_kv = Gauge("rodeco_kv_peak_tokens", "the largest KV cache any batch held, in tokens", registry=r)
        self.decode_tokens = Counter("rodeco_decode_tokens", "tokens decoded, every candidate's", registry=r)
        self.prefill_tokens = Counter("rodeco_prefill_tokens", "prompt tokens forwarded", registry=r)
        self.rejected_tokens = Counter(
            "rodeco_rejected_tokens", "tokens decoded by candidates later rejected", registry=r
        )
        self.rejected = Counter("rodeco_rejected_candidates", "candidates rejected at decision points", registry=r)
        self.started = Counter("rodeco_started_candidates", "candidates started", registry=r)
        self.flops = Counter("rodeco_flops", "FLOPs spent (generator and rewards)", registry=r)
        self.bon_flops = Counter(
            "rodeco_bon_flops_modelled",
            "FLOPs Best-of-best_of would have spent on the same requests (modelled)",
            registry=r,
        )
        self.saved = Counter("rodeco_flops_saved_modelled", "modelled Best-of-N FLOPs minus FLOPs spent", registry=r)
        self.cancelled = Counter(
            "rodeco_cancelled_requests", "requests whose client went away or timed out", registry=r
        )
        self.cancelled_rows = Counter(
            "rodeco_cancelled_rows", "rows that left a batch because their request was cancelled", registry=r
        )
        self.refused_slack = Counter(
            "rodeco_refused_latency_target",
            "requests refused (429) as the plan has them miss serve.latency_target",
            registry=r,
        )
        self.latency = Histogram(
            "rodeco_request_latency_seconds", "arrival to answer", ["endpoint"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.queue_wait = Histogram(
            "rodeco_queue_wait_seconds", "arrival to the start of its batch", buckets=LATENCY_BUCKETS, registry=r
        )
        self.first_token = Histogram(
            "rodeco_time_to_first_token_seconds",
            "arrival to the winner's first streamed token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
