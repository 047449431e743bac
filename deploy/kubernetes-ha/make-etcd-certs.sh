#!/usr/bin/env bash
# Writes the Secret gpuha-etcd-tls (etcd.yaml) with a new CA and one
# certificate for etcd's members, which the controllers also present as
# their client certificate. Needs openssl.
#   deploy/kubernetes-ha/make-etcd-certs.sh > etcd-tls.yaml && kubectl apply -f etcd-tls.yaml
set -euo pipefail
ns="${NAMESPACE:-gpuha-system}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cd "$dir"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
  -keyout ca.key -out ca.crt -subj /CN=gpuha-etcd-ca 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout tls.key -out tls.csr \
  -subj /CN=gpuha-etcd 2>/dev/null
printf '%s\n' \
  "subjectAltName=DNS:*.gpuha-etcd.$ns.svc,DNS:*.gpuha-etcd.$ns.svc.cluster.local,DNS:gpuha-etcd.$ns.svc,DNS:localhost,IP:127.0.0.1" \
  "extendedKeyUsage=serverAuth,clientAuth" > ext.cnf
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 \
  -extfile ext.cnf -out tls.crt 2>/dev/null
echo "apiVersion: v1"
echo "kind: Secret"
echo "metadata: { name: gpuha-etcd-tls, namespace: $ns }"
echo "type: Opaque"
echo "data:"
for f in ca.crt tls.crt tls.key; do echo "  $f: $(base64 -w0 "$f")"; done
