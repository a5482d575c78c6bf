import AppleIDSimulator
import ArgumentParser
import Crypto
import Foundation
import Gateway
import UnixSignals

struct AppleSimulatorCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apple-simulator",
        abstract: "Run the Apple ID simulator: a stand-in for appleid.apple.com for tests, staging and the bench.",
        discussion: """
            Generates (or takes) the team id, key id, client ids and .p8 key a gateway needs, prints
            them with an `apple:` configuration block, and serves /auth/authorize, /auth/token,
            /auth/revoke, /auth/keys, /.well-known/openid-configuration and the /sim/ control API
            until SIGINT or SIGTERM. Never expose it beyond a test network: it signs anyone in.
            """)

    @Option(help: "Address to listen on (host:port; port 0 picks a free one).")
    var listen: String = "127.0.0.1:9444"

    @Option(name: .customLong("team-id"), help: "10-character team id.")
    var teamID: String = "SIMTEAM001"

    @Option(name: .customLong("key-id"), help: "10-character key id of the Sign in with Apple key.")
    var keyID: String = "SIMKEY0001"

    @Option(name: .customLong("web-client"), help: "A Services ID and its return URLs: ID=URL[,URL…]. Repeatable. Default: com.example.web=http://127.0.0.1:8080/_auth/callback (loopback http allowed).")
    var webClients: [String] = []

    @Option(name: .customLong("app-id"), help: "An App ID (native apps). Repeatable.")
    var appIDs: [String] = ["com.example.app"]

    @Option(name: .customLong("key-file"), help: "Use this .p8 key instead of generating one.")
    var keyFile: String?

    @Option(name: .customLong("out"), help: "Directory for the generated AuthKey_<key id>.p8 (default: a new temporary directory).")
    var outDirectory: String?

    @Option(name: .customLong("notify-url"), help: "Where /sim/notify sends notifications by default.")
    var notifyURL: String?

    @Flag(name: .customLong("auto-consent"), help: "Consent at once as the first user instead of showing the consent page.")
    var autoConsent = false

    @Flag(name: .customLong("allow-http-loopback"), help: "Accept return URLs on localhost, 127.0.0.1 or [::1], over http:// or https:// (Apple accepts https to a domain name only: no IP address, no localhost).")
    var allowHTTPLoopback = false

    func run() async throws {
        guard let address = ListenAddress.parse(listen) else { throw ValidationError("--listen: '\(listen)' is not host:port") }
        var clients: [String: [String]] = [:]
        let loopbackHTTP = allowHTTPLoopback || webClients.isEmpty
        for entry in webClients.isEmpty ? ["com.example.web=http://127.0.0.1:8080/_auth/callback"] : webClients {
            let parts = entry.split(separator: "=", maxSplits: 1)
            guard parts.count == 2 else { throw ValidationError("--web-client: '\(entry)' is not ID=URL[,URL…]") }
            clients[String(parts[0])] = parts[1].split(separator: ",").map(String.init)
        }
        for app in appIDs { clients[app] = [] }
        let rules = SimulatedAppleID.Team(teamID: teamID, keys: [:], clients: clients, allowsLoopbackHTTP: loopbackHTTP)
        if let url = clients.values.joined().first(where: { !rules.acceptsReturnURL($0) }) {
            throw ValidationError("--web-client: Apple refuses \(url): https to a domain name only (no IP address, no localhost, no fragment)"
                                  + (loopbackHTTP ? "" : "; for localhost, 127.0.0.1 or [::1] on this machine, add --allow-http-loopback"))
        }

        let key: P256.Signing.PrivateKey
        let keyPath: String
        if let keyFile {
            key = try P256.Signing.PrivateKey(pemRepresentation: String(contentsOfFile: keyFile, encoding: .utf8))
            keyPath = keyFile
        } else {
            key = P256.Signing.PrivateKey()
            let directory = outDirectory ?? (NSTemporaryDirectory() + "sessiongate-simulator-\(UUID().uuidString)")
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            keyPath = "\(directory)/AuthKey_\(keyID).p8"
            guard FileManager.default.createFile(atPath: keyPath, contents: Data(key.pemRepresentation.utf8), attributes: [.posixPermissions: 0o600]) else {
                throw ValidationError("cannot write \(keyPath)")
            }
        }

        let simulator = try await SimulatedAppleID.start(
            team: .init(teamID: teamID, keys: [keyID: key.publicKey], clients: clients, allowsLoopbackHTTP: loopbackHTTP), host: address.host, port: address.port,
            notificationURL: notifyURL)
        if autoConsent { simulator.setFaults { $0.autoConsent = "" } }
        let clientList = ([clients.keys.filter { !(clients[$0]?.isEmpty ?? true) }.sorted()] + [clients.keys.filter { clients[$0]?.isEmpty ?? false }.sorted()]).flatMap { $0 }
        // Unbuffered: whoever started us (a test, a script) reads the address at once.
        FileHandle.standardOutput.write(Data("""
            Apple ID simulator
              base_url:    \(simulator.baseURL)
              team_id:     \(teamID)
              key_id:      \(keyID)
              key file:    \(keyPath)
              clients:     \(clients.keys.sorted().map { id in clients[id]!.isEmpty ? "\(id) (App ID)" : "\(id) → \(clients[id]!.joined(separator: ", "))" }.joined(separator: "; "))
              control:     \(simulator.baseURL)/sim/ (users, faults, counters, keys/rotate, notify)

            Gateway configuration:
            apple:
              team_id: "\(teamID)"
              client_ids: [\(clientList.map { "\"\($0)\"" }.joined(separator: ", "))]
              key_id: "\(keyID)"
              private_key_file: "\(keyPath)"
              base_url: "\(simulator.baseURL)"

            Ctrl-C stops it.

            """.utf8))
        for await _ in await UnixSignalsSequence(trapping: .sigint, .sigterm) { break }
        await simulator.stop()
    }
}
