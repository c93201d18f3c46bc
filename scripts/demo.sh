#!/usr/bin/env bash
# Plexus demo in network namespaces (as root): a test Kubernetes API server holds a pod that
# asks for two extra networks; plexus attaches eth0 (a flannel-shaped bridge network) plus
# net1/data0 from NetworkAttachmentDefinitions, writes the pod's network-status, then DEL
# removes everything.
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
  echo "$0: run as root (sudo $0 if you are not root)" >&2
  exit 1
fi
cd "$(dirname "$0")/.."
source scripts/setup.sh
# A dev build (a few minutes on a fresh machine; the release profile's fat LTO takes far longer
# and changes nothing the demo shows).
cargo build --locked -p plexus-meta -p plexus-e2e --bins 2>&1 | tail -1
BIN=$PWD/target/debug
W=$(mktemp -d /tmp/plexus-demo.XXXXXX)
NS=plexus-demo
API_PID=
cleanup() {
  [ -n "$API_PID" ] && kill "$API_PID" 2>/dev/null || true
  ip netns del $NS 2>/dev/null || true
  ip link del pxdemo-m0 2>/dev/null || true
  ip link del pxdemo-br0 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

mkdir -p "$W/seed"
cat > "$W/seed/pod.json" <<JSON
{"apiVersion":"v1","kind":"Pod","metadata":{"name":"pg-0","namespace":"bank","uid":"0b1c2d3e-demo",
 "annotations":{"k8s.v1.cni.cncf.io/networks":"[{\"name\":\"storage\",\"ips\":[\"10.56.0.10/24\"],\"mac\":\"02:00:00:56:00:10\"},{\"name\":\"replication\",\"interface\":\"data0\"}]"}},
 "spec":{"containers":[{"name":"postgres","image":"postgres:16"}]}}
JSON
cat > "$W/seed/nad-storage.json" <<JSON
{"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition","metadata":{"name":"storage","namespace":"bank"},
 "spec":{"config":"{\"cniVersion\":\"1.0.0\",\"name\":\"storage\",\"plugins\":[{\"type\":\"macvlan\",\"master\":\"pxdemo-m0\",\"mode\":\"bridge\",\"ipam\":{\"type\":\"static\"}},{\"type\":\"tuning\",\"capabilities\":{\"mac\":true}}]}"}}
JSON
cat > "$W/seed/nad-replication.json" <<JSON
{"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition","metadata":{"name":"replication","namespace":"bank"},
 "spec":{"config":"{\"cniVersion\":\"1.0.0\",\"type\":\"ptp\",\"ipam\":{\"type\":\"host-local\",\"dataDir\":\"$W/ipam\",\"ranges\":[[{\"subnet\":\"10.57.0.0/24\"}]]}}"}}
JSON

step "start the test Kubernetes API server (pod bank/pg-0 and two NADs)"
"$BIN/plexus-test-apiserver" --listen 127.0.0.1:0 --kubeconfig-out "$W/kubeconfig" --token demo-token --seed "$W/seed" 2> "$W/api.log" &
API_PID=$!
for _ in $(seq 100); do grep -q listening "$W/api.log" && break; sleep 0.05; done
URL=$(grep -o 'http://[0-9.:]*' "$W/api.log" | head -1)
echo "API server at $URL"

step "create the pod's network namespace and a host NIC for macvlan"
ip netns add $NS
ip link add pxdemo-m0 type veth peer name pxdemo-m1
ip link set pxdemo-m0 up; ip link set pxdemo-m1 up

cat > "$W/plexus.conf" <<JSON
{"cniVersion":"1.0.0","name":"plexus-network","type":"plexus","kubeconfig":"$W/kubeconfig",
 "cniDir":"$W/state","binDir":"/usr/lib/cni","logFile":"$W/plexus.log","logLevel":"verbose","logToStderr":false,
 "nadPolicy":{"paths":{"data":["$W/ipam"]}},
 "delegates":[{"cniVersion":"1.0.0","name":"cbr0","type":"bridge","bridge":"pxdemo-br0","isGateway":true,"isDefaultGateway":true,
   "ipam":{"type":"host-local","dataDir":"$W/ipam","ranges":[[{"subnet":"10.244.1.0/24"}]]}}]}
JSON
cniargs="IgnoreUnknown=1;K8S_POD_NAMESPACE=bank;K8S_POD_NAME=pg-0;K8S_POD_UID=0b1c2d3e-demo;K8S_POD_INFRA_CONTAINER_ID=demo-sandbox"
cni() { CNI_COMMAND=$1 CNI_CONTAINERID=demo-sandbox CNI_NETNS=$2 CNI_IFNAME=eth0 CNI_PATH=/usr/lib/cni CNI_ARGS=$cniargs "$BIN/plexus" < "$W/plexus.conf"; }

step "CNI ADD through plexus (what the kubelet runs); the result is the default network's"
cni ADD /run/netns/$NS | jq -c .
step "interfaces and routes inside the pod"
ip -n $NS -br addr
ip -n $NS route
step "the pod's k8s.v1.cni.cncf.io/network-status, as written to the API server"
curl -s -H "Authorization: Bearer demo-token" "$URL/api/v1/namespaces/bank/pods/pg-0" | jq -r '.metadata.annotations["k8s.v1.cni.cncf.io/network-status"]'
step "CNI CHECK"
cni CHECK /run/netns/$NS && echo "CHECK ok"
step "CNI DEL (no API request), then DEL again with an empty netns, as containerd does"
cni DEL /run/netns/$NS && cni DEL "" && echo "DEL ok"
step "what is left: only lo in the pod, no leases, no plans"
ip -n $NS -br link
find "$W/state/plans" "$W/ipam" -type f ! -name lock ! -name 'last_reserved_ip*' 2>/dev/null | sed 's/^/left: /' || true
echo "done."
