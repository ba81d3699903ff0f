# EPBuffer at scale (explicit stage): check ep over mpi at 64 ranks (every algorithm) and the
# unpruned matrix on local at 16 ranks, and a2a calls large enough for the sources to write.
set -euo pipefail
export DEEPINFER_COMM_TIMEOUT_S=${DEEPINFER_COMM_TIMEOUT_S:-300}
echo "--- check ep mpi W=64"
mpirun --oversubscribe -np 64 "$DEEPINFER" check ep --comm mpi --world 64 | tail -5
echo "--- check ep local W=16 --full"
"$DEEPINFER" check ep --comm local --world 16 --full | tail -4
# Calls past 32 MiB of rows: on local the a2a dispatch has the sources write (direct-push).
echo "--- check ep local W=4 algo=a2a hidden=8192 tokens=1024"
"$DEEPINFER" check ep --comm local --world 4 --algo a2a --hidden 8192 --tokens 1024 | tail -3
