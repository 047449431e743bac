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
// The suppression matches only blocks allocated with OpenSSL's TLS layer
// (libssl) on the stack: in these binaries only gRPC's handshakes run there
// (our controller and agent code calls libcrypto at most, for SHA-256). Not
// libgrpc as a whole: gRPC's threads run our callbacks (the controller's
// stream reactors), and their leaks must still be reported. OpenSSL is built
// without frame pointers, so the fast unwinder stops inside libcrypto; these
// binaries unwind every allocation in full instead.

extern "C" const char* __asan_default_options() { return "fast_unwind_on_malloc=0"; }

extern "C" const char* __lsan_default_suppressions() { return "leak:libssl.so\n"; }
