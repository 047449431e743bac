// Sanitizer defaults for the test binaries that run gRPC over TLS (linked in
// by gpuha_test(... GRPC_TLS) when GPUHA_SANITIZE is on).
//
// gRPC 1.51 (Debian 12) sometimes leaves OpenSSL objects behind when a TLS
// handshake is still in flight as its server shuts down: one CI run of
// ControllerServerTest.MutualTlsAdmitsOnlyAgentsWithACertificateItSigned
// reported 7 blocks from CRYPTO_zalloc, and 35 runs here, some under load,
// did not reproduce it. gRPC's own tree suppresses OpenSSL leaks for the
// same reason.
//
// The suppression matches only blocks allocated with libgrpc on the stack.
// OpenSSL is built without frame pointers, so the fast unwinder stops inside
// libcrypto; these binaries unwind every allocation in full instead, so a
// leak in our code, or in OpenSSL called from our code, is still reported.

extern "C" const char* __asan_default_options() { return "fast_unwind_on_malloc=0"; }

extern "C" const char* __lsan_default_suppressions() { return "leak:libgrpc.so\n"; }
