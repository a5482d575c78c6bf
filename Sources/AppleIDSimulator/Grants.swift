import Foundation

/// What the simulated Apple remembers: users, codes, tokens (in one locked value).
struct Grants {
    struct User {
        var sub: String
        var email: String
        var isPrivateEmail: Bool
        /// Apple verifies every Apple Account's email; a Sign in with Apple at Work & School
        /// (Managed Apple Account) email may be unverified.
        var emailVerified = true
        var realUserStatus: Int
        var firstName: String
        var lastName: String
        /// The user has authorized the team's app group (a Services ID and its primary App ID
        /// share one consent): the `user` JSON and `real_user_status` come only with the first.
        var authorized = false
        /// The scopes granted at that first authorization: the email claims only with `email`.
        var grantedScopes: Set<String> = []
    }

    struct Code {
        var sub: String
        var clientID: String
        var redirectURI: String?
        var nonce: String?
        var issuedAt: Int64
        var used = false
        /// Issued at the user's first authorization of the group.
        var firstAuthorization = false
    }

    struct RefreshToken {
        var sub: String
        var clientID: String
        var revoked = false
        var lastValidated: Int64? = nil
    }

    var users: [String: User] = [:]
    var codes: [String: Code] = [:]
    var refreshTokens: [String: RefreshToken] = [:]
    var accessTokens: [String: String] = [:]  // token → sub ("" for client-credentials tokens)
    /// When each migration (client-credentials) access token expires: `expires_in` holds.
    var accessTokenExpiry: [String: Int64] = [:]

    /// The user consents to the team's apps: authorized, or holding a live refresh token.
    func consents(_ sub: String) -> Bool {
        guard let user = users[sub] else { return false }
        return user.authorized || refreshTokens.values.contains { $0.sub == sub && !$0.revoked }
    }

    /// The user's private relay address at this team.
    static func relayAddress(for sub: String) -> String {
        "\(sub.prefix(10).replacingOccurrences(of: ".", with: ""))@privaterelay.appleid.com"
    }

    /// Apple's observed token shape: a prefix letter, 32 hex digits, `.0.`, 4 lower-case
    /// letters, `.`, 22 base64url characters (apple-sign-in.md §0). Opaque to the gateway.
    static func opaqueToken(prefix: Character) -> String {
        let hex = Array("0123456789abcdef"), lower = Array("abcdefghijklmnopqrstuvwxyz")
        let b64 = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        return String(prefix) + String((0..<32).map { _ in hex.randomElement()! }) + ".0."
            + String((0..<4).map { _ in lower.randomElement()! }) + "." + String((0..<22).map { _ in b64.randomElement()! })
    }

    /// `001437.<32 hex>.1951`-shaped user ids.
    static func subject() -> String {
        let hex = Array("0123456789abcdef")
        return String(format: "%06d", Int.random(in: 0..<1_000_000)) + "." + String((0..<32).map { _ in hex.randomElement()! })
            + "." + String(format: "%04d", Int.random(in: 0..<10_000))
    }
}
