import Foundation
import GatewayConfig
import Logging
import TestSupport
import Testing

@testable import Gateway

#if canImport(Glibc)
import Glibc
#endif

/// `Listeners.open` (issue 24): the listeners are bound in order, and a bind that fails closes
/// what was bound before it — a gateway that could not start leaves no port behind.
@Suite("Binding the listeners")
struct ListenersTests {
    @Test("a later listener's port in use (admin, redirect): the start fails naming its key, and the public port it had bound is free again",
          arguments: ["server.admin_listen", "server.redirect_http_listen"])
    func unwinds(key: String) async throws {
        let directory = try makeSecretsDirectory("listeners")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (fd, busy) = boundLoopbackSocket()
        #expect(listen(fd, 8) == 0)
        defer { close(fd) }
        let reserved = (ReservedPort(), ReservedPort())
        var c = GatewayConfiguration()
        c.server.listen = ListenAddress(host: "127.0.0.1", port: reserved.0.port)
        c.server.adminListen = ListenAddress(host: "127.0.0.1", port: key == "server.admin_listen" ? busy : reserved.1.port)
        if key == "server.redirect_http_listen" { c.server.redirectHTTPListen = ListenAddress(host: "127.0.0.1", port: busy) }
        c.server.accessLog = .off
        c.session.secretFile = .file(directory + "/session.key")
        c.routes = [.init(name: "public", pathPrefix: "/", upstream: UpstreamURL(host: "127.0.0.1", port: try closedPort()), auth: .public)]
        let service = try GatewayService(configuration: c, configPath: nil, logger: Logger(label: "listeners-test"))
        let failure = await #expect(throws: (any Error).self) { try await service.run() }
        #expect("\(failure.map { "\($0)" } ?? "")".contains(key), "\(String(describing: failure))")
        withExtendedLifetime(reserved) {}
        // Nothing listens on the public port any more: a plain bind of it succeeds.
        let probe = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(probe) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(reserved.0.port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let one: Int32 = 1
        _ = withUnsafePointer(to: one) { setsockopt(probe, SOL_SOCKET, SO_REUSEADDR, $0, socklen_t(MemoryLayout<Int32>.size)) }
        let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(probe, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        #expect(bound == 0 && listen(probe, 1) == 0, "the public listener was closed when a later bind failed")
    }
}
