# EngramBuffer (issue 21): `deepinfer check engram` (every fetch lowering the backend offers,
# bf16 and fp8 + scale factors, bit-exact against a host reference, and the agreed errors) on
# `local` at 1, 2, 4, 8, 16 ranks and on `mpi` at 2 and 4, and through a backend whose
# all_to_all_v is broken.
set -euo pipefail
export DEEPINFER_COMM_TIMEOUT_S=${DEEPINFER_COMM_TIMEOUT_S:-60}
for w in 1 2 4 8 16; do
  echo "--- check engram local W=$w"
  "$DEEPINFER" check engram --comm local --world "$w" | tail -1
done
for w in 2 4; do
  echo "--- check engram mpi W=$w"
  mpirun --oversubscribe -np "$w" "$DEEPINFER" check engram --comm mpi --world "$w" | tail -1
done
# A backend that breaks all_to_all_v (and, like every faulty wrapper, reports no peer memory):
# auto must take ag and pass.
echo "--- check engram local W=4 fault=a2av-hang"
"$DEEPINFER" check engram --comm local --world 4 --fault a2av-hang --timeout 20 | tail -1
