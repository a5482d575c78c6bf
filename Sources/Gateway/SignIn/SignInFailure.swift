import AppleID
import HTTPProxy
import NIOHTTP1

/// The two ways in: Apple's web redirect, and a native app's token exchange.
enum SignInFlow: String, Sendable, CaseIterable {
    case web, native
}

/// The `outcome` label of `sessiongate_sign_ins_total`.
enum SignInOutcome: String, Sendable, CaseIterable {
    case ok, cancelled, rejected
    case appleUnavailable = "apple_unavailable"
    case appleMisconfigured = "apple_misconfigured"
    case storeUnavailable = "store_unavailable"
    case throttled
}

/// Why a sign-in did not complete, classified once where it is understood and mapped here, once,
/// to its status, its page (web) or JSON (native), and its metric.
enum SignInFailure: Error, Equatable {
    /// The request is not what the flow expects; the reason is for the client.
    case malformed(String)
    /// The native body is not `application/json` (a cross-site form cannot send that).
    case notJSON
    /// The callback arrived without the pre-auth cookie this browser got at `/login`.
    case loginNotStarted
    /// The login state is unknown, used, expired, or another browser's.
    case loginExpired
    /// Apple answered the authorization with an error other than a cancel.
    case appleDeclined
    /// An identity token failed verification (a transient reason: Apple's keys unreachable).
    case identityToken(AppleTokenRejection)
    /// Apple refused the code (`invalid_grant`: expired, used, or another client's).
    case codeRefused
    /// The code's user is not the identity token's user.
    case otherUsersCode
    /// Apple could not be reached or answered nonsense.
    case appleUnavailable
    /// Apple refused our client (`invalid_client` and kin): the operators' problem.
    case appleMisconfigured
    /// The session store did not answer in time.
    case storeUnavailable
    /// Too many code exchanges for this user (native) or client address (web) in this minute
    /// (`apple.exchanges_per_minute`), or sign-ins started from this client address
    /// (`apple.logins_per_minute`).
    case throttled(retryAfter: Int)
    /// This instance holds as many sign-ins in progress as `apple.max_pending_logins` allows:
    /// no new one starts, whoever asks, until its window ends.
    case busy(retryAfter: Int)
    /// A native nonce was required and missing, unknown, used or another client's.
    case nonce(String)

    var status: HTTPResponseStatus {
        switch self {
        case .malformed, .loginNotStarted, .loginExpired, .appleDeclined, .codeRefused, .nonce: .badRequest
        case .notJSON: .unsupportedMediaType
        case .identityToken(let r): r.isTransient ? .badGateway : .unauthorized
        case .otherUsersCode: .unauthorized
        case .appleUnavailable, .appleMisconfigured: .badGateway
        case .storeUnavailable: .serviceUnavailable
        case .throttled: .tooManyRequests
        case .busy: .serviceUnavailable
        }
    }

    var outcome: SignInOutcome {
        switch self {
        case .identityToken(let r) where r.isTransient: .appleUnavailable
        case .malformed, .notJSON, .loginNotStarted, .loginExpired, .appleDeclined, .identityToken, .codeRefused, .otherUsersCode, .nonce: .rejected
        case .appleUnavailable: .appleUnavailable
        case .appleMisconfigured: .appleMisconfigured
        case .storeUnavailable: .storeUnavailable
        case .throttled, .busy: .throttled
        }
    }

    /// The `error` member of the native JSON answer.
    var code: String {
        switch self {
        case .malformed, .notJSON: "invalid_request"
        case .identityToken(let r) where r.isTransient: "apple_unavailable"
        case .identityToken: "invalid_identity_token"
        case .codeRefused, .otherUsersCode, .loginNotStarted, .loginExpired, .appleDeclined: "invalid_grant"
        case .appleUnavailable: "apple_unavailable"
        case .appleMisconfigured: "apple_misconfigured"
        case .storeUnavailable: "store_unavailable"
        case .throttled: "too_many_requests"
        // RFC 6749 §4.1.2.1: the server is temporarily overloaded.
        case .busy: "temporarily_unavailable"
        case .nonce: "invalid_nonce"
        }
    }

    /// What the person (or the app's developer) reads.
    var detail: String {
        switch self {
        case .malformed(let reason): reason
        case .notJSON: "the body must be JSON (Content-Type: application/json)"
        case .loginNotStarted: "No sign-in was started in this browser, or its cookies are blocked. Please start again."
        case .loginExpired: "This sign-in took too long, was already used, or was started in another browser."
        case .appleDeclined: "Apple did not complete the sign-in."
        case .identityToken(let r) where r.isTransient: "Apple could not be reached. Please try again in a moment."
        case .identityToken(let r): "Apple's identity token could not be verified (\(r.rawValue))."
        case .codeRefused: "Apple refused the sign-in code: it expired or was already used."
        case .otherUsersCode: "The authorization code belongs to another user."
        case .appleUnavailable: "Apple could not be reached. Please try again in a moment."
        case .appleMisconfigured: "Sign in with Apple is misconfigured on this site; the operators have been alerted."
        case .storeUnavailable: "Your sign-in could not be completed just now. Please try again."
        case .throttled(let seconds): "Too many sign-ins just now. Please try again in \(Self.wait(seconds))."
        case .busy(let seconds): "Too many sign-ins are in progress on this site just now. Please try again in \(Self.wait(seconds))."
        case .nonce(let reason): reason
        }
    }

    private var title: String {
        switch self {
        case .loginExpired: "Sign in expired"
        case .storeUnavailable, .appleUnavailable, .throttled, .busy: "Sign in is unavailable"
        case .identityToken(let r) where r.isTransient: "Sign in is unavailable"
        default: "Sign in failed"
        }
    }

    private var headers: [(String, String)] {
        switch self {
        case .throttled(let seconds), .busy(let seconds): [("retry-after", String(seconds))]
        default: []
        }
    }

    /// "45 seconds", "1 minute", "10 minutes": a wait as a person reads it.
    static func wait(_ seconds: Int) -> String {
        guard seconds >= 60 else { return seconds == 1 ? "1 second" : "\(seconds) seconds" }
        let minutes = (seconds + 59) / 60
        return minutes == 1 ? "1 minute" : "\(minutes) minutes"
    }

    /// The web flow's page: what happened, and a link to start again from `signIn`.
    func page(startAgain signIn: String, clearing cookies: [(String, String)] = []) -> LocalResponse {
        AuthResponses.html(status, AuthPages.message(title: title, detail: detail, action: ("Start again", signIn)), headers: cookies + headers)
    }

    /// The native flow's JSON answer.
    var json: LocalResponse {
        AuthResponses.json(status, ["error": code, "message": detail], headers: headers)
    }
}

extension AppleTokenOutcome {
    /// The failure a code exchange's answer is, if it is one.
    var signInFailure: SignInFailure? {
        switch self {
        case .success: nil
        case .grantRevoked: .codeRefused
        case .clientMisconfigured: .appleMisconfigured
        case .transient, .throttled: .appleUnavailable
        }
    }
}
