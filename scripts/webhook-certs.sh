#!/usr/bin/env bash
# The admission webhook's certificate, then its configuration.
#
#   scripts/webhook-certs.sh                 a CA of its own (openssl) signs
#                                            the serving certificate, in the
#                                            Secret switchyard-webhook-tls
#   scripts/webhook-certs.sh --cert-manager  cert-manager issues them
#                                            (config/kubernetes/webhook-cert-manager.yaml)
#   scripts/webhook-certs.sh --out DIR       only writes ca.crt, tls.crt, tls.key
#
# Then it waits until the webhook's Deployment is available and applies
# config/kubernetes/webhook-configuration.yaml with the CA as its caBundle:
# the API server sends pods to the webhook only once it answers, so no pod
# is refused for want of it. Apply config/kubernetes (kubectl apply -k)
# first. Run it again to renew (the webhook reloads the certificate files
# when the Secret changes).
set -euo pipefail
ns=switchyard-system
svc=switchyard-webhook
days=825
here="$(cd "$(dirname "$0")" && pwd)"
config="$here/../config/kubernetes"
out=""
mode=openssl
case "${1:-}" in
  --out) out="${2:?--out needs a directory}"; mkdir -p "$out" ;;
  --cert-manager) mode=cert-manager ;;
  "") ;;
  *) echo "usage: $0 [--cert-manager | --out DIR]" >&2; exit 2 ;;
esac

if [ "$mode" = cert-manager ]; then
  kubectl apply -f "$config/webhook-cert-manager.yaml"
  kubectl -n "$ns" wait --for=condition=Ready "certificate/$svc" --timeout=300s
  ca_bundle="$(kubectl -n "$ns" get secret "$svc-tls" -o 'jsonpath={.data.ca\.crt}')"
else
  dir="${out:-$(mktemp -d)}"
  [ -n "$out" ] || trap 'rm -rf "$dir"' EXIT
  openssl req -x509 -newkey rsa:2048 -nodes -days "$days" \
    -subj "/CN=switchyard-webhook CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$svc.$ns.svc" \
    -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
  cat > "$dir/ext.cnf" <<EXT
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:$svc,DNS:$svc.$ns,DNS:$svc.$ns.svc,DNS:$svc.$ns.svc.cluster.local
EXT
  openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -days "$days" -extfile "$dir/ext.cnf" -out "$dir/tls.crt" 2>/dev/null
  rm -f "$dir/tls.csr" "$dir/ext.cnf" "$dir/ca.srl"
  if [ -n "$out" ]; then
    rm -f "$dir/ca.key"
    echo "wrote $dir/ca.crt $dir/tls.crt $dir/tls.key"
    exit 0
  fi
  kubectl -n "$ns" create secret tls "$svc-tls" --cert="$dir/tls.crt" --key="$dir/tls.key" \
    --dry-run=client -o yaml | kubectl apply -f -
  ca_bundle="$(base64 -w0 < "$dir/ca.crt")"
fi

# The webhook serves with the certificate once a replica is available.
kubectl -n "$ns" rollout status "deployment/$svc" --timeout=300s
# Its configuration, the CA in caBundle (under clientConfig).
sed "s|^\( *\)clientConfig:\$|&\n\1  caBundle: $ca_bundle|" \
  "$config/webhook-configuration.yaml" | kubectl apply -f -
echo "Secret $ns/$svc-tls in place; the webhook is configured"
