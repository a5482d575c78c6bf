import AppleID
import AsyncHTTPClient
import Crypto
import GatewayConfig
import Logging
import NIOCore

/// The Apple side of sign-in: the token client and the identity-token verifier.
struct AppleServices: Sendable {
    let tokens: AppleTokenClient
    let verifier: IdentityTokenVerifier
    let notifications: NotificationVerifier
    let secrets: ClientSecretMinter
    let keySet: AppleKeySet
    let clientIDs: [String]
    /// `apple.app_groups` (nil: one group of all the client ids).
    let appGroups: [[String]]?
    let baseURL: String
    /// The `.p8` as read at start (a reload compares it).
    let keyDigest: SHA256Digest

    init(configuration a: GatewayConfiguration.Apple, httpClient: HTTPClient, logger: Logger) throws {
        let bytes = try a.privateKeyFile.read(key: "apple.private_key_file")
        keyDigest = SHA256.hash(data: bytes)
        let pem = String(decoding: bytes, as: UTF8.self)
        let minter: ClientSecretMinter
        do {
            minter = try ClientSecretMinter(teamID: a.teamID, keyID: a.keyID, privateKeyPEM: pem, backdate: a.clockSkew.components.seconds)
        } catch {
            throw StartupFailure(key: "apple.private_key_file", "\(error)")
        }
        let timeout = TimeAmount(a.timeout)
        secrets = minter
        tokens = AppleTokenClient(baseURL: a.baseURL, httpClient: httpClient, secrets: minter, timeout: timeout, logger: logger)
        let keySet = AppleKeySet(baseURL: a.baseURL, httpClient: httpClient, timeout: timeout, logger: logger)
        self.keySet = keySet
        verifier = IdentityTokenVerifier(keySet: keySet, clientIDs: a.clientIDs, leeway: a.clockSkew.components.seconds)
        notifications = NotificationVerifier(keySet: keySet, clientIDs: a.clientIDs, leeway: a.clockSkew.components.seconds)
        clientIDs = a.clientIDs
        appGroups = a.appGroups
        baseURL = a.baseURL
    }

    /// The client ids a notification for `audience` concerns: its app group, or nil when that
    /// is every client id (one group).
    func appGroup(of audience: String) -> [String]? {
        guard let groups = appGroups, let group = groups.first(where: { $0.contains(audience) }), Set(group) != Set(clientIDs) else { return nil }
        return group
    }

    /// The Services ID: the web flow's client id.
    var webClientID: String { clientIDs[0] }
}

extension TimeAmount {
    init(_ duration: Duration) {
        self = .nanoseconds(duration.components.seconds * 1_000_000_000 + duration.components.attoseconds / 1_000_000_000)
    }
}

