import AsyncHTTPClient
import GatewayConfig
import NIOCore
import NIOPosix

/// `sessiongate reload` and `check --reload` (issue 28 §1): ask the gateway running with a
/// configuration, through its admin listener (`POST /reload`), to reload its file, or to try
/// it without swapping (`dry_run`), and report what it answered. `systemctl reload` runs the
/// first, so a refused reload fails the unit's reload instead of exiting 0.
public enum AdminReload {
    public struct Answer: Sendable {
        /// The gateway reloaded (or, dry, would).
        public let accepted: Bool
        /// Its answer: a summary line, then one `file:line:col: error:` line per reason.
        public let lines: [String]
    }

    /// Where the admin listener of `c` is reached from this host (a wildcard address is
    /// reached on loopback).
    public static func url(_ c: GatewayConfiguration, dryRun: Bool) -> String {
        let listen = c.server.adminListen
        let host = listen.host == "0.0.0.0" || listen.host.isEmpty ? "127.0.0.1" : listen.host == "::" ? "::1" : listen.host
        return "http://\(ListenAddress(host: host, port: listen.port))/reload" + (dryRun ? "?dry_run=1" : "")
    }

    /// The gateway's answer, or why there was none (no gateway listens there).
    public static func ask(_ c: GatewayConfiguration, dryRun: Bool) async -> Result<Answer, AdminReloadFailure> {
        let url = url(c, dryRun: dryRun)
        let client = HTTPClient(eventLoopGroupProvider: .shared(MultiThreadedEventLoopGroup.singleton))
        defer { Task { try? await client.shutdown() } }
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        do {
            // A reload resolves every upstream name: seconds at worst.
            let response = try await client.execute(request, timeout: .seconds(60))
            let body = try await response.body.collect(upTo: 1 << 20)
            let lines = String(buffer: body).split(separator: "\n").map(String.init)
            switch response.status.code {
            case 200: return .success(Answer(accepted: true, lines: lines))
            case 409, 422: return .success(Answer(accepted: false, lines: lines))
            default: return .failure(AdminReloadFailure(description: "\(url) answered \(response.status.code): \(lines.first ?? "")"))
            }
        } catch {
            return .failure(AdminReloadFailure(description: "no gateway answers at \(url) (server.admin_listen): \(error)"))
        }
    }
}

public struct AdminReloadFailure: Error, Sendable, CustomStringConvertible {
    public let description: String
}
