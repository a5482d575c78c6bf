import HTTPProxy
import NIOHTTP1

/// The request a front proxy (nginx `auth_request`, Caddy `forward_auth`, Traefik
/// `forwardAuth`) asks `/_auth/check` about: its method and URI travel in headers, its `Accept`
/// and `X-Requested-With` as they are.
///
/// When the answer is 401, a browser navigating with GET or HEAD should be sent to sign in and
/// come back; anything else (a script, a POST) gets the 401 as it is. Which of the two is decided
/// here, once, for every front proxy.
struct ForwardAuthRequest: Equatable {
    /// On a 401 from `/_auth/check`: where the front proxy should redirect a browser.
    static let signInHeader = "X-Sessiongate-Sign-In"

    var method: String
    /// The original request target (path and query).
    var uri: String?
    var accept: [String]
    var requestedWith: Bool

    /// `X-Forwarded-Method`/`-Uri` (Caddy, Traefik) or `X-Original-Method`/`-URI` (the nginx
    /// example sets them); without them, the check request's own method.
    init(_ headers: HTTPHeaders, checkMethod: String = "GET") {
        method = headers.first(name: "x-forwarded-method") ?? headers.first(name: "x-original-method") ?? checkMethod
        uri = headers.first(name: "x-forwarded-uri") ?? headers.first(name: "x-original-uri")
        accept = headers["accept"]
        requestedWith = headers.contains(name: "x-requested-with")
    }

    init(method: String, uri: String?, accept: [String], requestedWith: Bool = false) {
        self.method = method
        self.uri = uri
        self.accept = accept
        self.requestedWith = requestedWith
    }

    /// The sign-in page with the original URI as `rd` (validated like every return URL; an
    /// unacceptable one becomes `/`), or nil when the 401 should be answered as it is.
    func signInURL(prefix: String, policy: ReturnURLPolicy) -> String? {
        let m = method.uppercased()
        guard m == "GET" || m == "HEAD", AuthResponses.wantsHTML(accept: accept, requestedWith: requestedWith) else { return nil }
        let rd = uri.flatMap(policy.validate) ?? "/"
        return "\(prefix)/sign-in?rd=\(FormBody.escape(rd))"
    }
}
