import NIOHTTP1

/// The gateway's own endpoints under `server.auth_prefix` (DESIGN §1), one row each: its path
/// and the methods it answers. A path not in the table is 404; a method not in its row is 405
/// with `Allow`. Each flow lives in its own file (`WebSignIn`, `NativeSignIn`, `AppleEvents`).
enum AuthEndpoint: String, CaseIterable, Sendable {
    case signIn = "/sign-in"
    case login = "/login"
    /// A sign-in ticket redeemed on the routed host the sign-in started on (`HostSignIn`).
    case redeem = "/redeem"
    case callback = "/callback"
    case native = "/native"
    case nativeNonce = "/native/nonce"
    case logout = "/logout"
    case userinfo = "/userinfo"
    case check = "/check"
    case jwks = "/jwks.json"
    case appleNotifications = "/apple/notifications"
    case revoke = "/revoke"
    /// The user deletes their account (App Store Review Guideline 5.1.1(v)): GET is the
    /// confirmation page, POST the deletion.
    case accountDelete = "/account/delete"
    case links = "/links"

    var methods: [HTTPMethod] {
        switch self {
        case .signIn, .check: [.GET, .HEAD]
        case .login, .redeem, .userinfo, .jwks: [.GET]
        case .callback, .native, .nativeNonce, .appleNotifications, .revoke: [.POST]
        case .logout, .accountDelete: [.GET, .POST]
        case .links: [.POST, .DELETE]
        }
    }

    /// The state-changing endpoints a browser could be tricked into posting to. Not the
    /// callback (Apple's own cross-site POST, bound by state and the pre-auth cookie) and not
    /// Apple's notifications (server to server, signed).
    var checksOrigin: Bool {
        switch self {
        case .logout, .revoke, .accountDelete, .native, .nativeNonce: true
        default: false
        }
    }

    private static let byPath = Dictionary(uniqueKeysWithValues: allCases.map { (Substring($0.rawValue), $0) })

    init?(path: Substring) {
        guard let endpoint = Self.byPath[path] else { return nil }
        self = endpoint
    }
}
