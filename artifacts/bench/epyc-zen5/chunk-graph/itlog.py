"""Per engine iteration during a budgeted admission: total, prefill, runner.step, emit; the slowest ones."""
import sys, time
from runtime import LoadConfig, load
from runtime.engine import engine as E
from runtime.engine import runner as R
from exporter.bench import streams as S
cur = {}
its = []
def wrap(cls, name, key):
    orig = getattr(cls, name)
    def f(self, *a, **k):
        t = time.perf_counter()
        try: return orig(self, *a, **k)
        finally: cur[key] = cur.get(key, 0) + 1e3 * (time.perf_counter() - t)
    setattr(cls, name, f)
wrap(E.Engine, "_prefill", "prefill"); wrap(R.Runner, "step", "rstep"); wrap(E.Engine, "_step", "step")
orig = E.Engine._carry_out
def co(self, plan):
    cur.clear(); t = time.perf_counter(); orig(self, plan)
    its.append(dict(cur, total=1e3 * (time.perf_counter() - t), admitted=len(plan.admitted), t=time.monotonic()))
E.Engine._carry_out = co
rt = load(sys.argv[1], LoadConfig(num_threads=2))
prompts = S._prompts(rt.manifest.vocab_size, 8, 32)
rt.generate(prompts[0], max_new_tokens=4)
long_prompt = S._prompts(rt.manifest.vocab_size, 1, 512)[0]
for _ in range(2):
    its.clear()
    a = S.admission(rt, prompts[:-1], long_prompt, 256, 32, 1.0)
    print({k: round(v, 2) for k, v in a.items() if isinstance(v, float)})
    # gaps between iteration ends
    ends = [x["t"] for x in its]
    rows = [(round(1e3 * (b - a), 1), {k: round(v, 1) for k, v in x.items() if k != "t"}) for a, b, x in zip(ends, ends[1:], its[1:])]
    for g, x in sorted(rows, key=lambda r: -r[0])[:10]: print(g, x)
