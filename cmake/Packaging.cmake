# What `cmake --install` puts where, and the .deb CPack makes of it
# (`make package`). The binary goes to /usr/bin; its debug info goes into a
# separate gpuha-dbgsym .ddeb (Debian's convention), found again through the
# binary's build-id.
include(GNUInstallDirs)

install(TARGETS gpuha RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES
          ${PROJECT_SOURCE_DIR}/deploy/systemd/gpuha-agent.service
          ${PROJECT_SOURCE_DIR}/deploy/systemd/gpuha-controller.service
          ${PROJECT_SOURCE_DIR}/deploy/systemd/gpuha-router.service
        DESTINATION lib/systemd/system)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/gpuha.sysusers
        DESTINATION lib/sysusers.d RENAME gpuha.conf)
# Shell completions for bash, zsh and fish, written by the binary from its
# own command tree (`gpuha completion SHELL`), so they follow every flag. Not
# in the sanitizer build, which is never packaged (a sanitized binary run at
# build time could fail the build on a report of its own).
if(NOT GPUHA_SANITIZE)
  set(GPUHA_COMPLETIONS ${CMAKE_BINARY_DIR}/completions)
  add_custom_command(
    OUTPUT ${GPUHA_COMPLETIONS}/gpuha ${GPUHA_COMPLETIONS}/_gpuha ${GPUHA_COMPLETIONS}/gpuha.fish
    COMMAND ${CMAKE_COMMAND} -E make_directory ${GPUHA_COMPLETIONS}
    COMMAND sh -c "$<TARGET_FILE:gpuha> completion bash > ${GPUHA_COMPLETIONS}/gpuha"
    COMMAND sh -c "$<TARGET_FILE:gpuha> completion zsh > ${GPUHA_COMPLETIONS}/_gpuha"
    COMMAND sh -c "$<TARGET_FILE:gpuha> completion fish > ${GPUHA_COMPLETIONS}/gpuha.fish"
    DEPENDS gpuha
    VERBATIM)
  add_custom_target(gpuha_completions ALL
    DEPENDS ${GPUHA_COMPLETIONS}/gpuha ${GPUHA_COMPLETIONS}/_gpuha ${GPUHA_COMPLETIONS}/gpuha.fish)
  install(FILES ${GPUHA_COMPLETIONS}/gpuha
          DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions)
  install(FILES ${GPUHA_COMPLETIONS}/_gpuha DESTINATION ${CMAKE_INSTALL_DATADIR}/zsh/vendor-completions)
  install(FILES ${GPUHA_COMPLETIONS}/gpuha.fish
          DESTINATION ${CMAKE_INSTALL_DATADIR}/fish/vendor_completions.d)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples
        FILES_MATCHING PATTERN "*.yaml")
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/LICENSE
              ${PROJECT_SOURCE_DIR}/deploy/debian/copyright
        DESTINATION ${CMAKE_INSTALL_DOCDIR})
# Debian policy 12.7: the changelog as changelog.Debian.gz, compressed with
# no timestamp (gzip -n) so that the package builds the same twice.
set(GPUHA_CHANGELOG_GZ ${CMAKE_BINARY_DIR}/changelog.Debian.gz)
add_custom_command(
  OUTPUT ${GPUHA_CHANGELOG_GZ}
  COMMAND sh -c "gzip -9n -c '${PROJECT_SOURCE_DIR}/deploy/debian/changelog' > '${GPUHA_CHANGELOG_GZ}'"
  DEPENDS ${PROJECT_SOURCE_DIR}/deploy/debian/changelog
  VERBATIM)
add_custom_target(gpuha_changelog ALL DEPENDS ${GPUHA_CHANGELOG_GZ})
install(FILES ${GPUHA_CHANGELOG_GZ} DESTINATION ${CMAKE_INSTALL_DOCDIR})

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME gpuha)
set(CPACK_PACKAGE_VENDOR "gpuha developers")
set(CPACK_PACKAGE_CONTACT "gpuha developers <gpuha@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "keeps GPU inference serving while GPUs, nodes and links fail")
set(CPACK_PACKAGE_DESCRIPTION
    "One binary with the agent, controller, router, planner, simulator, worker and operator CLI.")
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_LICENSE Apache-2.0)
# Runtime dependencies from the libraries the binary links (dpkg-shlibdeps).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# Debug info split off into gpuha-dbgsym_*.ddeb, and the packaged binary
# stripped of it (objcopy), as Debian packages do.
set(CPACK_DEBIAN_DEBUGINFO_PACKAGE ON)
# Maintainer scripts (deploy/debian): the agent's user created at install
# from the sysusers file, the units reloaded, and stopped on removal.
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/deploy/debian/postinst
    ${PROJECT_SOURCE_DIR}/deploy/debian/prerm
    ${PROJECT_SOURCE_DIR}/deploy/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
