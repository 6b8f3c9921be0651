# The image the Kubeflow specs (trainjob.yaml, pytorchjob.yaml) run: CUDA PyTorch with scaletrain and its `train`
# extra. Build from the repository root and push where the cluster pulls from:
#   docker build -t REGISTRY/scaletrain:0.1.0 . && docker push REGISTRY/scaletrain:0.1.0
# The -devel base has nvcc: DeepSpeed builds its CPU-Adam (offload) ops on first use.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-devel

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HOME=/runs/.cache/huggingface

WORKDIR /opt/scaletrain
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install ".[train]" && scaletrain --version

# The run folder is mounted here (the PersistentVolumeClaim in the specs); the specs give the command.
WORKDIR /runs
CMD ["scaletrain", "--help"]
