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

// A second kind: OpenSSL's per-thread error queue (ERR_STATE, 904 bytes),
// allocated by the first ERR_* call on a thread and freed when that thread
// exits. One CI run of EtcdTlsTest.AControllerReachesEtcdOverMutualTlsAndNothingElseDoes
// (a refused handshake) reported it from a gRPC executor thread that was
// still winding down when the process exited; the stack holds libcrypto and
// libgrpc only. The entries name the ERR_* entry points that create the
// queue (the allocating function itself is static, so unsymbolized), not
// libcrypto as a whole: our own libcrypto calls (SHA-256) stay checked.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libssl.so\n"
         "leak:ERR_clear_error\n"
         "leak:ERR_new\n"
         "leak:ERR_set_mark\n"
         "leak:ERR_get_error\n"
         "leak:ERR_peek_error\n"
         "leak:ERR_peek_last_error\n";
}
