# EPBuffer (issue 3): `deepinfer check ep` with every algorithm (ag, a2a, auto) on `local` at
# 1..64 ranks and on `mpi` at 2, 3, 4, 8, plus `auto` routing around a backend declared broken.
# 64 ranks over mpi: scripts/stages/large_ep.sh (explicit stage `large_ep`).
set -euo pipefail
export DEEPINFER_COMM_TIMEOUT_S=${DEEPINFER_COMM_TIMEOUT_S:-60}
for w in 1 2 3 4 8 16 32 64; do
  echo "--- check ep local W=$w"
  "$DEEPINFER" check ep --comm local --world "$w" | tail -4
done
for w in 2 3 4 8; do
  echo "--- check ep mpi W=$w"
  mpirun --oversubscribe -np "$w" "$DEEPINFER" check ep --comm mpi --world "$w" | tail -5
done
# Faults that make the backend distrust all_to_all_v: auto must pick ag and pass (W=8 > K=6,
# so auto would take a2a on a healthy backend); forced a2a falls back to the padded lowering.
# Large calls: a2a sends x rows apart from their records and takes the direct lowering.
echo "--- check ep local W=2 algo=a2a hidden=8192"
"$DEEPINFER" check ep --comm local --world 2 --algo a2a --hidden 8192 | tail -2
echo "--- check ep mpi W=3 algo=a2a hidden=8192"
mpirun --oversubscribe -np 3 "$DEEPINFER" check ep --comm mpi --world 3 --algo a2a --hidden 8192 | tail -2
for f in a2av-hang a2a-diverge; do
  echo "--- check ep local W=8 fault=$f"
  "$DEEPINFER" check ep --comm local --world 8 --algo auto --fault "$f" --timeout 20 | tail -3
  "$DEEPINFER" check ep --comm local --world 8 --algo a2a --fault "$f" --timeout 20 | tail -3
done
# The DEEPINFER_EP_* knobs reach the matrix's configs (EPConfig::from_knobs in the CLI).
echo "--- check ep local W=2 algo=a2a under DEEPINFER_EP_PEER_MEMORY=off DEEPINFER_EP_CHUNK_BYTES=8K"
log=$(DEEPINFER_LOG=debug DEEPINFER_EP_PEER_MEMORY=off DEEPINFER_EP_CHUNK_BYTES=8K "$DEEPINFER" check ep --comm local \
  --world 2 --algo a2a 2>&1)
echo "$log" | tail -1
grep -q "chunk=8192 peer_memory=off -> algorithm a2a" <<<"$log" || { echo "check ep: the EP knobs were not applied"; exit 1; }
echo "--- check ep mpi W=4 fault=a2av-hang"
mpirun --oversubscribe -np 4 "$DEEPINFER" check ep --comm mpi --world 4 --algo auto --fault a2av-hang --timeout 20 | tail -3
