"""What a workspace needs to build cpptrain, the project's own or one that depends on it.

In the WORKSPACE of an application (Bazel 4.2.3, offline, Debian 12 packages):

    local_repository(name = "cpptrain", path = "/path/to/cpptrain")
    load("@cpptrain//:deps.bzl", "cpptrain_dependencies")
    cpptrain_dependencies()

then depend on "@cpptrain" (every library a Trainer application needs) or on single targets
such as "@cpptrain//trainer". No .bazelrc line is needed: compile flags that the project's
targets need travel with them (//third_party/system), and the settings that cannot travel with
a target are made here, as repositories. third_party/README.md describes each one.
"""

load("@bazel_tools//tools/cpp:cc_configure.bzl", "cc_autoconf_impl")

# A file at the root of the cpptrain checkout. As a Label it resolves inside the repository
# this file belongs to: the main repository in the project's own build, @cpptrain in another
# workspace.
_CPPTRAIN_ROOT_FILE = Label("//:WORKSPACE")

def _checkout_repository_impl(rctx):
    src = rctx.path(_CPPTRAIN_ROOT_FILE).dirname
    for part in rctx.attr.dir.split("/"):
        src = src.get_child(part)
    if not src.exists:
        fail("cpptrain_dependencies: %s does not exist in the cpptrain checkout" % src)
    for child in src.readdir():
        rctx.symlink(child, child.basename)

# A local_repository whose path is a directory of the cpptrain checkout, wherever that is
# (local_repository's relative paths are relative to the main workspace, not to cpptrain).
_checkout_repository = repository_rule(
    implementation = _checkout_repository_impl,
    attrs = {"dir": attr.string(mandatory = True)},
    local = True,
)

# The toolchain's default C++ flag, which Bazel 4.2.3's auto-configuration writes into the
# generated BUILD file unless BAZEL_CXXOPTS is set.
_AUTOCONF_CXX_STANDARD = "\"-std=c++0x\""

def _cc_toolchain_with_standard_impl(rctx):
    cc_autoconf_impl(rctx)
    if "BAZEL_CXXOPTS" in rctx.os.environ:
        return  # The user chose the C++ flags (and the standard) explicitly.
    build = rctx.read("BUILD")
    if _AUTOCONF_CXX_STANDARD not in build:
        fail(("cpptrain_dependencies: the auto-configured C++ toolchain has no %s to replace " +
              "with -std=%s (a Bazel other than 4.2.3?). Call cpptrain_dependencies(" +
              "cxx_standard = None) and pass --cxxopt=-std=%s instead.") %
             (_AUTOCONF_CXX_STANDARD, rctx.attr.cxx_standard, rctx.attr.cxx_standard))
    rctx.file(
        "BUILD",
        build.replace(_AUTOCONF_CXX_STANDARD, "\"-std=%s\"" % rctx.attr.cxx_standard),
        executable = False,
    )

# Bazel's auto-configured host C++ toolchain (@local_config_cc, what --crosstool_top points
# to by default), compiling C++ as cxx_standard instead of C++11. LibTorch's headers need
# C++14 and cpptrain's C++17, in every target that includes them, the application's too; a
# cc_library can carry defines and include directories to its dependents, not a -std flag.
_cc_toolchain_with_standard = repository_rule(
    implementation = _cc_toolchain_with_standard_impl,
    attrs = {"cxx_standard": attr.string(mandatory = True)},
    configure = True,
    # The variables the auto-configuration reads on Linux (refetched when one changes).
    environ = [
        "ABI_LIBC_VERSION",
        "ABI_VERSION",
        "BAZEL_COMPILER",
        "BAZEL_CXXOPTS",
        "BAZEL_HOST_SYSTEM",
        "BAZEL_LINKLIBS",
        "BAZEL_LINKOPTS",
        "BAZEL_TARGET_CPU",
        "BAZEL_TARGET_LIBC",
        "BAZEL_TARGET_SYSTEM",
        "BAZEL_USE_CPP_ONLY_TOOLCHAIN",
        "BAZEL_DO_NOT_DETECT_CPP_TOOLCHAIN",
        "CC",
        "CC_CONFIGURE_DEBUG",
        "CC_TOOLCHAIN_NAME",
        "CPLUS_INCLUDE_PATH",
        "GCOV",
        "USER",
    ],
)

def cpptrain_dependencies(cxx_standard = "c++17"):
    """Declares the repositories cpptrain needs. Call it in WORKSPACE, after loading it.

    Everything is local: Debian 12 packages (bazel-bootstrap, bazel-rules-java, libtorch-dev,
    protobuf-compiler, libprotobuf-dev, ...; tools/install_deps.sh) and directories of the
    cpptrain checkout. Repositories declared after this call replace these (the last
    definition of a name wins), so a workspace can still bring its own.

    Args:
      cxx_standard: the -std= of every C++ compile in the workspace, set in Bazel's
        auto-configured toolchain (@local_config_cc). None leaves the toolchain alone; then
        pass --cxxopt=-std=c++17 (or set BAZEL_CXXOPTS) yourself.
    """

    # Bazel 4.2.3 declares these three with http_archive in its WORKSPACE prefix and needs
    # them even for builds that use none of them; offline, they must come from here.
    # rules_cc: cc/defs.bzl re-exports the native rules (Debian's rules_cc is too new).
    _checkout_repository(name = "rules_cc", dir = "third_party/rules_cc")

    # Coverage tools named by the default test toolchain; unavailable offline (a stub).
    _checkout_repository(name = "remote_coverage_tools", dir = "third_party/remote_coverage_tools")

    # From Debian's bazel-rules-java.
    native.local_repository(name = "rules_java", path = "/usr/share/bazel/rules/java")

    # The system protoc and libprotobuf where --proto_compiler and --proto_toolchain_for_cc
    # look by default (@com_google_protobuf//:protoc, :cc_toolchain). A workspace that has
    # its own com_google_protobuf keeps it; it must then match Debian's libprotobuf 3.21,
    # which LibTorch links.
    if not native.existing_rule("com_google_protobuf"):
        _checkout_repository(name = "com_google_protobuf", dir = "third_party/protobuf")

    # LibTorch's C++ frontend headers (//third_party/system:torch depends on them).
    native.new_local_repository(
        name = "cpptrain_libtorch_api",
        path = "/usr/include/torch/csrc/api/include",
        # A string in Bazel 4.2.3; str() of the Label keeps it inside this repository.
        build_file = str(Label("//third_party/system:libtorch_api.BUILD")),
    )

    if cxx_standard:
        _cc_toolchain_with_standard(name = "local_config_cc", cxx_standard = cxx_standard)
