import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The service manager's side of `sd_notify(3)`: a Unix datagram socket whose path goes to the
/// gateway in `NOTIFY_SOCKET`, as systemd's is for a `Type=notify` unit.
final class NotifySocket: @unchecked Sendable {
    let path: String
    private let fd: Int32

    init() throws {
        path = NSTemporaryDirectory() + "notify-\(UInt32.random(in: 0 ... .max)).sock"
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in for (i, b) in bytes.enumerated() { raw[i] = b } }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard fd >= 0, bound == 0 else { throw Failure(description: "cannot bind \(path): \(String(cString: strerror(errno)))") }
    }

    struct Failure: Error, CustomStringConvertible { let description: String }

    /// The next datagram, or nil after `seconds`.
    func next(within seconds: Int32 = 20) async throws -> String? {
        let fd = self.fd
        return try await blocking {
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, seconds * 1000) == 1 else { return nil }
            var buffer = [UInt8](repeating: 0, count: 4096)
            let count = recv(fd, &buffer, buffer.count, 0)
            return count < 0 ? nil : String(decoding: buffer[..<count], as: UTF8.self)
        }
    }

    func close() {
        _ = Glibc.close(fd)
        unlink(path)
    }
}

@Suite("systemd: Type=notify and sessiongate reload (process)", .serialized, .timeLimit(.minutes(2)))
struct SystemdNotifyTests {
    static func run(_ arguments: [String]) async throws -> (status: Int32, output: [String]) {
        let process = try GatewayProcess(arguments: arguments)
        let status = await process.waitForExit()
        await process.waitForOutputEnd()
        return (status, process.output)
    }

    @Test("the store's state goes to systemd when it changes: STATUS= says the store is unreachable once Redis stops, and that it answers once it is back")
    func storeStatus() async throws {
        let socket = try NotifySocket()
        defer { socket.close() }
        let directory = try makeSecretsDirectory("notify-store")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let redis = try RedisServerProcess()
        defer { redis.stop() }
        let path = directory + "/sessiongate.yaml"
        try redisGatewayYAML(directory: directory, redisURL: "redis://127.0.0.1:\(redis.port)/0").write(toFile: path, atomically: true, encoding: .utf8)
        try await GatewayProcess.with(arguments: ["serve", "--config", path], environment: ["NOTIFY_SOCKET": socket.path]) { gateway in
            _ = try await gateway.ports()
            #expect(try await socket.next() == "READY=1\nSTATUS=listening; the session store answered")
            redis.stop()
            #expect(try await socket.next() == "STATUS=session store unreachable: guarded routes answer 503")
            try redis.start()
            #expect(try await socket.next() == "STATUS=listening; the session store answers")
        }
    }

    @Test("ready once listening, reloading then ready with each reload's outcome, stopping at the drain; reload and check --reload name a refused key")
    func notifyAndReload() async throws {
        let socket = try NotifySocket()
        defer { socket.close() }
        let directory = NSTemporaryDirectory() + "notify-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/sessiongate.yaml"
        let admin = try closedPort()
        func write(listen: String, strip: String) throws {
            try """
                server:
                  listen: "\(listen)"
                  admin_listen: "127.0.0.1:\(admin)"
                identity:
                  strip_headers: ["\(strip)"]
                routes:
                  - name: a
                    upstream: "http://127.0.0.1:1"
                    auth: public
                """.write(toFile: path, atomically: true, encoding: .utf8)
        }
        try write(listen: "127.0.0.1:0", strip: "X-A")
        try await GatewayProcess.with(arguments: ["serve", "--config", path], environment: ["NOTIFY_SOCKET": socket.path]) { gateway in
            _ = try await gateway.ports()
            #expect(try await socket.next() == "READY=1\nSTATUS=listening; the session store answered")

            // A key that reloads.
            try write(listen: "127.0.0.1:0", strip: "X-B")
            let reloaded = try await Self.run(["reload", "--config", path])
            #expect(reloaded.status == 0)
            #expect(reloaded.output.first == "ok: configuration reloaded from \(path)", "\(reloaded.output)")
            #expect(try await socket.next()?.hasPrefix("RELOADING=1\nMONOTONIC_USEC=") == true)
            #expect(try await socket.next() == "READY=1\nSTATUS=configuration reloaded")

            // A key that applies only at restart: the dry run (check --reload) and the reload name it.
            try write(listen: "127.0.0.1:\(try closedPort())", strip: "X-C")
            let checked = try await Self.run(["check", "--reload", "--config", path])
            #expect(checked.status == 1)
            #expect(checked.output.contains { $0.hasPrefix("\(path):2:3: error: server.listen: changes only at restart") }, "\(checked.output)")
            let refused = try await Self.run(["reload", "--config", path])
            #expect(refused.status == 1)
            #expect(refused.output.first == "refused: \(path) changes keys that apply only at restart; the running configuration stays", "\(refused.output)")
            #expect(refused.output.contains { $0.hasPrefix("\(path):2:3: error: server.listen: changes only at restart") })
            // The dry run notified nothing: the next datagrams are the reload's.
            #expect(try await socket.next()?.hasPrefix("RELOADING=1\n") == true)
            #expect(try await socket.next() == "READY=1\nSTATUS=configuration reload refused: the running configuration stays (1 problem)")

            // A file the gateway rejects (its upstream does not resolve; the file itself parses).
            try write(listen: "127.0.0.1:0", strip: "X-A")
            try (try String(contentsOfFile: path, encoding: .utf8)).replacingOccurrences(of: "http://127.0.0.1:1", with: "http://no-such-host.invalid:1")
                .write(toFile: path, atomically: true, encoding: .utf8)
            let rejected = try await Self.run(["reload", "--config", path])
            #expect(rejected.status == 1)
            #expect(rejected.output.first == "rejected: \(path) has errors; the running configuration stays", "\(rejected.output)")
            #expect(rejected.output.contains { $0.contains("error: routes[0].upstream: the host 'no-such-host.invalid' does not resolve") }, "\(rejected.output)")
            #expect(try await socket.next()?.hasPrefix("RELOADING=1\n") == true)
            #expect(try await socket.next()?.hasPrefix("READY=1\nSTATUS=configuration reload rejected: the running configuration stays") == true)
            // Only tools reload: not a GET, not a web page's POST (neither is notified).
            let (get, fromPage) = try await blocking { () -> (Int, Int) in
                func ask(_ request: String) throws -> Int {
                    let c = try RawClient(port: admin)
                    try c.send(request)
                    return try c.readResponse().status
                }
                return (try ask("GET /reload HTTP/1.1\r\nHost: a\r\n\r\n"),
                        try ask("POST /reload HTTP/1.1\r\nHost: a\r\nOrigin: https://evil.example\r\nContent-Length: 0\r\n\r\n"))
            }
            #expect(get == 405 && fromPage == 403)

            gateway.signal(SIGTERM)
            #expect(try await socket.next() == "STOPPING=1\nSTATUS=draining in-flight requests")
            #expect(await gateway.waitForExit() == 0)
        }
        // No gateway any more (and a file that checks): reload fails and says where it asked;
        // check --reload only notes it.
        try write(listen: "127.0.0.1:0", strip: "X-A")
        let nobody = try await Self.run(["reload", "--config", path])
        #expect(nobody.status == 1)
        #expect(nobody.output.contains { $0.contains("error: no gateway answers at http://127.0.0.1:\(admin)/reload (server.admin_listen)") }, "\(nobody.output)")
        let alone = try await Self.run(["check", "--reload", "--config", path])
        #expect(alone.status == 0 && alone.output.last == "ok", "\(alone.output)")
    }
}
