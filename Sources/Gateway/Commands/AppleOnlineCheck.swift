import AppleID
import AsyncHTTPClient
import GatewayConfig
import Logging
import NIOPosix

/// `sessiongate check --online`: proves the `apple:` section against Apple (or the simulator)
/// without a user — Apple's keys are fetched, a client secret is minted for every client id,
/// and exchanging a made-up code must give `invalid_grant` (the secret was accepted), never
/// `invalid_client`.
public enum AppleOnlineCheck {
    /// One line per check, each starting with `ok:` or `error:`; `ok` when none failed.
    public static func run(_ c: GatewayConfiguration, logger: Logger) async -> (ok: Bool, lines: [String]) {
        guard let a = c.apple else { return (true, ["ok: no apple: section, nothing to check online"]) }
        let client = HTTPClient(eventLoopGroupProvider: .shared(MultiThreadedEventLoopGroup.singleton))
        defer { Task { try? await client.shutdown() } }
        let apple: AppleServices
        do {
            apple = try AppleServices(configuration: a, httpClient: client, logger: logger)
        } catch {
            return (false, ["error: \(error)"])
        }
        var lines: [String] = []
        var ok = true
        _ = try? await apple.keySet.key(for: "sessiongate-check-online")  // fetches the set
        let kids = await apple.keySet.keyIDs
        if kids.isEmpty {
            ok = false
            lines.append("error: apple.base_url: no keys from \(a.baseURL)/auth/keys (unreachable or not Apple)")
        } else {
            lines.append("ok: \(kids.count) signing key\(kids.count == 1 ? "" : "s") from \(a.baseURL)/auth/keys")
        }
        let callback = (c.server.publicURL ?? "") + c.server.authPrefix + "/callback"
        for (index, id) in a.clientIDs.enumerated() {
            let outcome = await apple.tokens.exchange(code: "sessiongate-check-online", clientID: id, redirectURI: index == 0 ? callback : nil)
            switch outcome {
            case .grantRevoked, .success:
                lines.append("ok: apple.client_ids: \(id): Apple accepts our client secret")
            case .clientMisconfigured(let error):
                ok = false
                lines.append("error: apple.client_ids: \(id): Apple answered \(error): check apple.team_id, key_id, private_key_file and that the key is enabled for this client id")
            case .transient(let reason, _):
                ok = false
                lines.append("error: apple.base_url: \(id): Apple did not answer usefully (\(reason))")
            case .throttled:
                ok = false
                lines.append("error: apple.client_ids: \(id): Apple throttles this client (429); try again later")
            }
        }
        return (ok, lines)
    }
}
