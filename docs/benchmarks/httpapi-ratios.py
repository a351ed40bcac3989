#!/usr/bin/env python3
# Medians and per-round ratios of BenchmarkHTTPClaims rounds (docs/benchmarks/httpapi.md).
import re,statistics,collections,sys
rounds=[]; cur=None
for l in open(sys.argv[1]):
    if l.startswith('round'):
        cur={}; rounds.append((l.strip(),cur)); continue
    m=re.match(r'BenchmarkHTTPClaims/(\S+)/(bare-http|inprocess|http)-2\s+\d+\s+[\d.]+ ns/op\s+([\d.]+) claims/s',l)
    if m and cur is not None: cur[(m.group(1),m.group(2))]=float(m.group(3))
shapes=[]
for _,r in rounds:
    for (s,_) in r:
        if s not in shapes: shapes.append(s)
print(f"{len(rounds)} rounds")
for s in shapes:
    vals=collections.defaultdict(list); rb=[]; ri=[]; rmb=[]
    for _,r in rounds:
        for mode in ('bare-http','inprocess','http'):
            if (s,mode) in r: vals[mode].append(r[(s,mode)])
        if (s,'http') in r and (s,'inprocess') in r: ri.append(r[(s,'http')]/r[(s,'inprocess')])
        if (s,'http') in r and (s,'bare-http') in r: rb.append(r[(s,'http')]/r[(s,'bare-http')])
    med={k:statistics.median(v) for k,v in vals.items()}
    line=f"{s:38s} " + "  ".join(f"{k} {med[k]:>9.0f}" for k in ('bare-http','inprocess','http') if k in med)
    if ri: line+=f"  http/inproc {statistics.median(ri):.3f} [{min(ri):.2f}-{max(ri):.2f}]"
    if rb: line+=f"  http/bare {statistics.median(rb):.3f} [{min(rb):.2f}-{max(rb):.2f}]"
    print(line)
