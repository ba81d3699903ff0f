# The EP family beside `ep` (issue 21). EngramBuffer: `deepinfer check engram` (every fetch
# lowering the backend offers, bf16 and fp8 + scale factors, bit-exact against a host reference,
# and the agreed errors) on `local` at 1, 2, 4, 8, 16 ranks and on `mpi` at 2 and 4, and through a
# backend whose all_to_all_v is broken. BucketBuffer: `deepinfer check bucket` (all_gather against
# a plain all_gather, reduce_scatter against a host reduce_scatter in DeepEP's order, fp32 and
# stochastic bf16, the agreed errors) at the same sizes; then distributed loading through it
# (DEEPINFER_LOAD=bucket) must give `check e2e` the logits hash of plain loading.
set -euo pipefail
export DEEPINFER_COMM_TIMEOUT_S=${DEEPINFER_COMM_TIMEOUT_S:-60}
for check in engram bucket; do
  for w in 1 2 4 8 16; do
    echo "--- check $check local W=$w"
    "$DEEPINFER" check "$check" --comm local --world "$w" | tail -1
  done
  for w in 2 4; do
    echo "--- check $check mpi W=$w"
    mpirun --oversubscribe -np "$w" "$DEEPINFER" check "$check" --comm mpi --world "$w" | tail -1
  done
done
# A backend that breaks all_to_all_v (and, like every faulty wrapper, reports no peer memory):
# auto must take ag and pass.
echo "--- check engram local W=4 fault=a2av-hang"
"$DEEPINFER" check engram --comm local --world 4 --fault a2av-hang --timeout 20 | tail -1

MODEL=${MODEL:-models/tiny}
echo "--- check e2e EP=1 with plain (mmap) loading: the baseline hash"
hash=$(DEEPINFER_LOAD=mmap "$DEEPINFER" check e2e --model "$MODEL" --ep 1 | sed -n 's/^logits hash: //p')
[[ -n "$hash" ]] || { echo "engram: no logits hash printed"; exit 1; }
echo "logits hash: $hash"
for ep in 1 2; do
  echo "--- check e2e local EP=$ep DEEPINFER_LOAD=bucket (each rank reads 1/$ep of the replicated bytes)"
  out=$(DEEPINFER_LOAD=bucket "$DEEPINFER" check e2e --model "$MODEL" --ep "$ep" --expect-hash "$hash" 2>&1)
  echo "$out" | grep "load (bucket)"
  echo "$out" | tail -2
done
echo "--- check e2e mpi EP=2 DEEPINFER_LOAD=bucket"
DEEPINFER_LOAD=bucket mpirun --oversubscribe -x DEEPINFER_LOAD -np 2 "$DEEPINFER" check e2e --model "$MODEL" --ep 2 \
  --comm mpi --expect-hash "$hash" | tail -2

# An Engram model: its tables are sharded by rows, never in the bucketed replicated set; each rank
# reads its own rows in both modes, and the hash is plain loading's.
ENGRAM_MODEL=${ENGRAM_MODEL:-models/tiny-engram}
echo "--- check e2e $ENGRAM_MODEL EP=2: DEEPINFER_LOAD=bucket gives plain loading's hash"
ehash=$(DEEPINFER_LOAD=mmap "$DEEPINFER" check e2e --model "$ENGRAM_MODEL" --ep 2 |
  sed -n 's/^logits hash: //p')
[[ -n "$ehash" ]] || { echo "engram: no logits hash printed ($ENGRAM_MODEL)"; exit 1; }
DEEPINFER_LOAD=bucket "$DEEPINFER" check e2e --model "$ENGRAM_MODEL" --ep 2 --expect-hash "$ehash" |
  tail -2
