@testable import HTTPProxy
import NIOCore
import NIOHTTP1
import Testing

@testable import Gateway

/// The demo app's page (issue 14 §3): an unlinked user is shown how the app links them; a linked
/// one sees the account the gateway sent.
@Suite("Demo upstream")
struct DemoUpstreamTests {
    static func page(_ headers: [(String, String)]) -> String {
        var head = HTTPRequestHead(version: .http1_1, method: .GET, uri: "/")
        head.headers.add(name: "accept", value: "text/html")
        for (n, v) in headers { head.headers.add(name: n, value: v) }
        let response = DemoUpstream.respond(SimpleRequest(head: head, body: ByteBuffer(), remoteAddress: nil),
                                            linking: ("http://localhost:8080/_auth/links", "s3cret"))
        return String(buffer: response.body)
    }

    @Test("unlinked: the call that links; linked: the account; anonymous: neither")
    func linking() {
        let unlinked = Self.page([("X-Auth-User", "001.abc")])
        #expect(unlinked.contains("Not linked") && unlinked.contains("curl -X POST http://localhost:8080/_auth/links")
                && unlinked.contains("&quot;sub&quot;:&quot;001.abc&quot;"))
        let linked = Self.page([("X-Auth-User", "001.abc"), ("X-Auth-Account", "demo-42")])
        #expect(linked.contains("Linked to the app's account <b>demo-42</b>") && !linked.contains("curl"))
        #expect(!Self.page([]).contains("curl"))
    }
}
