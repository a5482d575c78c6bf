import Foundation
import Gateway
import Logging
import Testing

@Suite("The operator's revoke goes the gateway's way")
struct OperatorRevokeTests {
    @Test("sessions revoke's core tells the app user.revoked (reason operator) and the running gateway refuses the user's next request")
    func operatorRevokeReachesAppAndFleet() async throws {
        try await EventReceiver.with { receiver in
            try await SignInHarness.with(store: .redis, localCacheTTL: .seconds(3600), assertion: true, configure: { c in
                c.events.url = receiver.url
            }) { h in
                let sub = h.simulator.createUser()
                let browser = TestBrowser(gatewayOrigin: h.origin)
                _ = try await browser.signIn(from: "/x", as: sub)
                #expect(try await browser.request("/x").status == 200, "the session works (and is now in the gateway's cache for an hour)")

                // What `sessiongate sessions revoke --sub` runs, with the gateway's own configuration.
                let tools = try OperatorTools(configuration: h.configuration, logger: Logger(label: "operator"))
                let (ended, queued) = try await tools.revoke(sub, queueAtApple: false, forget: false)
                await tools.close()
                #expect(ended == 1 && queued == 0)

                let event = try await AppEventsTests.verified(try #require(await receiver.waitFor(1).first), gateway: browser)
                #expect(event["type"] as? String == "user.revoked" && event["sub"] as? String == sub && event["reason"] as? String == "operator", "\(event)")
                let delay = try await RevocationTests().timeUntil(302) { try await browser.request("/x").status }
                #expect(delay != nil, "the gateway still admits the revoked user from its cache")
            }
        }
    }
}
