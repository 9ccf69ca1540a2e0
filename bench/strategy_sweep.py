import sys, json, itertools
from pathlib import Path
from rebalancer.sim import engine, traces
from strategies import registry
T=[("examples/traces/azure_llm_2024_week_per_minute.csv","code","America/Los_Angeles"),
   ("examples/traces/azure_llm_2024_week_per_minute.csv","conv","America/Los_Angeles"),
   ("examples/traces/servegen_m-large.csv",None,"Asia/Shanghai"),
   ("examples/traces/servegen_m-mid.csv",None,"Asia/Shanghai"),
   ("examples/traces/servegen_m-small.csv",None,"Asia/Shanghai")]
loaded=[(traces.load(Path(p),s),z) for p,s,z in T]
name=sys.argv[1]; params=json.loads(sys.argv[2]) if len(sys.argv)>2 else {}
for tr,z in loaded:
    pm=engine.PoolModel(zone=z)
    r=engine.run(tr, registry.build(name,params), pm)
    f=r.figures
    assert f is not None
    c=pm.calibrate(tr); plan=engine.oracle_plan(engine.needs(tr,pm,c),pm)
    orc=sum(max(0,plan[i-1]-plan[i]) for i in range(1,len(plan)))
    print(f"{tr.name:45s} harvest {f.harvest_ratio:.3f} breach {f.breach_minutes:4d} headroom {f.headroom_minutes:4d} reclaims {f.reclaims} (oracle {orc}) loans {f.loans} short {f.short_loans}")
