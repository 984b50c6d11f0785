# The fleet's router image: vLLM's own router (vllm-project/router), version 0.1.17 from PyPI,
# the version the offline rehearsal runs. Build it once on the router host:
#   docker build -f launch/vllm-router.Dockerfile -t dsv4-vllm-router:0.1.17 launch/
# and name that tag as router.image in pairs/fleet.yaml (docs/fleet.md says why not :nightly).
ARG BASE=python:3.12-slim-bookworm
FROM ${BASE}
# The wheel carries the Rust router; it must match the sha256 of the PyPI file for this
# machine (x86_64 or aarch64). Its Python dependencies are installed after it.
RUN printf '%s\n' 'vllm-router==0.1.17 \
    --hash=sha256:85c96bea4d573a49b5a8ae4c72ee3dfe733aba26b6f1ff1256e6142f1f42694d \
    --hash=sha256:1ec4d5ce14c19431cc84e36238507dff89020ab024d99f042f091f5e9f2c895a' \
      > /tmp/router.txt \
 && pip install --no-cache-dir --no-deps --only-binary=:all: --require-hashes -r /tmp/router.txt \
 && pip install --no-cache-dir --only-binary=:all: vllm-router==0.1.17 \
 && rm /tmp/router.txt \
 && vllm-router --help > /dev/null
ENTRYPOINT ["vllm-router"]
