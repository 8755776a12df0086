#!/bin/bash
# Plain multi-node torchrun, no scheduler: run this on every node with its own NODE_RANK.
#   node 0:  NODE_RANK=0 HEAD=10.0.0.1 NNODES=2 deploy/multinode.sh --config configs/vit_b16.toml
#   node 1:  NODE_RANK=1 HEAD=10.0.0.1 NNODES=2 deploy/multinode.sh --config configs/vit_b16.toml
# The run dir must be on storage every node sees (rank 0 writes metrics; checkpoints are sharded).
set -euo pipefail
: "${NODE_RANK:?set NODE_RANK (0 on the head node)}" "${HEAD:?set HEAD to node 0's address}"
NNODES=${NNODES:-2}
GPUS=${GPUS:-$(nvidia-smi -L | wc -l)}
PORT=${PORT:-29500}
RUN_DIR=${RUN_DIR:-runs/multinode}

# Same thing by hand with torchrun:
#   torchrun --nnodes $NNODES --node-rank $NODE_RANK --master-addr $HEAD --master-port $PORT \
#            --nproc-per-node $GPUS -m kiln train --run-dir $RUN_DIR "$@"
exec kiln train --nproc-per-node "$GPUS" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
  --rdzv-endpoint "$HEAD:$PORT" --run-dir "$RUN_DIR" "$@"
