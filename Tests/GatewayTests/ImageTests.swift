import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// `make image` (issue 28 §4): the OCI image is unpacked as a runtime would and the binary run
/// from it, as its non-root user, with the configuration mounted at /etc/sessiongate. `make test`
/// builds the image first, of the binary built with the tests (`SESSIONGATE_IMAGE`, default
/// `image` in the build directory: `.build-test/image`, or `.build/image` after `make image`);
/// unpacking and `chroot` need root, as the CI machine is.
@Suite("container image (make image)", .serialized, .timeLimit(.minutes(2)))
struct ImageTests {
    static let layout = ProcessInfo.processInfo.environment["SESSIONGATE_IMAGE"] ?? buildDirectory.appendingPathComponent("../../image").standardized.path

    /// The unpacked bundle (`config.json` and `rootfs/`), removed after `body`.
    static func withBundle<Result>(_ body: (String) async throws -> Result) async throws -> Result {
        try #require(FileManager.default.fileExists(atPath: layout + "/index.json"), "no image at \(layout): run `make image` (make test does)")
        let bundle = NSTemporaryDirectory() + "bundle-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: bundle) }
        let (status, output) = try await blocking { runCapturingOutput("/usr/bin/umoci", ["unpack", "--image", layout + ":sessiongate", bundle]) }
        try #require(status == 0, "umoci unpack: \(output)")
        return try await body(bundle)
    }

    @Test("the image runs as a non-root user with serve on the mounted configuration, and holds no shell")
    func configuration() async throws {
        try await Self.withBundle { bundle in
            let data = try Data(contentsOf: URL(fileURLWithPath: bundle + "/config.json"))
            let config = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
            let process = try #require(config["process"] as? [String: Any])
            let user = try #require(process["user"] as? [String: Any])
            #expect(user["uid"] as? Int == 10001 && user["gid"] as? Int == 10001)
            #expect(process["args"] as? [String] == ["/usr/local/bin/sessiongate", "serve", "--config", "/etc/sessiongate/sessiongate.yaml"])
            let rootfs = bundle + "/rootfs"
            for absent in ["/bin/sh", "/usr/bin/sh", "/bin/bash", "/usr/bin/apt-get"] {
                #expect(!FileManager.default.fileExists(atPath: rootfs + absent), "\(absent) is in the image")
            }
            let packages = try String(contentsOfFile: rootfs + "/usr/share/doc/sessiongate/image-packages.txt", encoding: .utf8)
            #expect(packages.contains("libc6 ") && packages.contains("ca-certificates "), "\(packages)")
            // RESP is read by the Redis module itself: hiredis is the tests' oracle only.
            #expect(!packages.contains("libhiredis"), "\(packages)")
        }
    }

    @Test("from the unpacked image: check passes on a mounted configuration, and serve answers /healthz and /readyz")
    func runsFromTheImage() async throws {
        try await Self.withBundle { bundle in
            let rootfs = bundle + "/rootfs"
            // The "mount": the configuration and secrets under /etc/sessiongate, readable by 10001.
            let secrets = rootfs + "/etc/sessiongate"
            // 64 bytes, as the README's `head -c 64 /dev/urandom`: a secret file's trailing CR/LF
            // bytes are dropped (an `echo`'s newline), and 32 random bytes end in one about once
            // in 128 runs (a fresh clone's make test failed so: "31 bytes").
            try Data((0..<64).map { _ in UInt8.random(in: 0 ... 255) }).write(to: URL(fileURLWithPath: secrets + "/session.key"))
            let admin = try closedPort()
            try """
                server:
                  listen: "127.0.0.1:0"
                  admin_listen: "127.0.0.1:\(admin)"
                session:
                  secret_file: "/etc/sessiongate/session.key"
                routes:
                  - name: app
                    upstream: "http://localhost:9"
                    auth: public
                """.write(toFile: secrets + "/sessiongate.yaml", atomically: true, encoding: .utf8)
            for file in ["session.key", "sessiongate.yaml"] { chmod(secrets + "/" + file, 0o644) }
            // A runtime mounts /proc (Swift reads its arguments from /proc/self/cmdline).
            let mounted = runCapturingOutput("/usr/bin/mount", ["-t", "proc", "proc", rootfs + "/proc"])
            try #require(mounted.status == 0, "mount /proc: \(mounted.output)")
            defer { _ = runCapturingOutput("/usr/bin/umount", [rootfs + "/proc"]) }
            let inImage = ["--userspec=10001:10001", rootfs, "/usr/local/bin/sessiongate"]
            let check = try await blocking { runCapturingOutput("/usr/sbin/chroot", inImage + ["check", "--config", "/etc/sessiongate/sessiongate.yaml"]) }
            #expect(check.status == 0, "\(check.output)")
            #expect(check.output.hasSuffix("ok\n"), "\(check.output)")
            try await GatewayProcess.with(arguments: inImage + ["serve", "--config", "/etc/sessiongate/sessiongate.yaml"], executable: "/usr/sbin/chroot") { gateway in
                let ports = try await gateway.ports()
                let (health, ready) = try await blocking {
                    func get(_ path: String) throws -> RawClient.Response {
                        let c = try RawClient(port: ports.admin)
                        try c.send("GET \(path) HTTP/1.1\r\nHost: a\r\n\r\n")
                        return try c.readResponse()
                    }
                    return (try get("/healthz"), try get("/readyz"))
                }
                #expect(health.status == 200 && ready.status == 200)
                gateway.signal(SIGTERM)
                #expect(await gateway.waitForExit() == 0)
            }
        }
    }
}
