#!/usr/bin/env bash
# Probe (one device call, docs/GPU.md): do cuBLASLt's Hopper kernels wait for the previous grid
# (griddepcontrol.wait) before reading their inputs, so that a programmatic graph edge into them
# would be safe? Finds the SASS opcodes of griddepcontrol.wait / .launch_dependents from a
# two-kernel diff, then counts cuBLASLt's sm_90a functions (nvjet and all) that hold them.
set -uo pipefail
OUT=${OUT:-device-out}; mkdir -p "$OUT"
cd /tmp
cat > a.cu <<'X'
__global__ void k(float* p){ asm volatile("griddepcontrol.wait;" ::: "memory"); p[threadIdx.x]+=1; asm volatile("griddepcontrol.launch_dependents;");}
X
cat > b.cu <<'X'
__global__ void k(float* p){ p[threadIdx.x]+=1; }
X
ops() { cuobjdump -sass "$1" | grep -oE "^\s+/\*[0-9a-f]{4}\*/\s+[A-Z][A-Z0-9_.]*" | awk '{print $2}' | sed 's/\..*//' | sort -u; }
nvcc -arch=sm_90a -cubin -o a.cubin a.cu && nvcc -arch=sm_90a -cubin -o b.cubin b.cu || exit 1
cuobjdump -sass a.cubin | grep -E "^\s+/\*[0-9a-f]{4}\*/" | head -20
NEW=$(comm -23 <(ops a.cubin) <(ops b.cubin) | tr '\n' ' ')
echo "opcodes griddepcontrol adds: $NEW"
LIB=$(ls /usr/local/cuda/lib64/libcublasLt.so.* 2>/dev/null | grep -E "so\.[0-9]+$" | head -1)
echo "lib: $LIB"
t0=$(date +%s)
timeout ${SCAN_S:-400} cuobjdump -sass -arch sm_90a "$LIB" 2>/dev/null | awk -v ops="$NEW" '
  BEGIN { n_ops = split(ops, op, " ") }
  function flush() { if (f == "") return; n++; for (i = 1; i <= n_ops; i++) if (has[i]) cnt[i]++;
    if (f ~ /nvjet/) { nj++; for (i = 1; i <= n_ops; i++) if (has[i]) jcnt[i]++;
      if (nj <= 4 || (f ~ /64x32|48x64|128x64/ && shown++ < 6)) { s = ""; for (i = 1; i <= n_ops; i++) s = s " " op[i] "=" has[i]; print "nvjet:" s " " f } } }
  /Function : /{ flush(); f = $3; for (i = 1; i <= n_ops; i++) has[i] = 0; next }
  { for (i = 1; i <= n_ops; i++) if (index($0, " " op[i]) > 0) has[i] = 1 }
  END { flush(); s = ""; js = ""; for (i = 1; i <= n_ops; i++) { s = s " " op[i] ":" cnt[i]+0; js = js " " op[i] ":" jcnt[i]+0 }
        print "functions", n, "holding" s; print "nvjet functions", nj+0, "holding" js }' |
  tee "$OUT/pdl_probe.txt"
echo "scan: $(( $(date +%s) - t0 )) s"
