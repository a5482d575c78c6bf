import ArgumentParser
import Foundation
import Gateway
import Logging

struct SessionsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sessions",
        abstract: "Operator tools against the configured session store (store.redis_url).",
        subcommands: [List.self, Revoke.self])

    struct Target: ParsableArguments {
        @OptionGroup var options: ConfigOption
        @Option(name: .long, help: "The user's Apple id (the `sub`, as in X-Auth-User).")
        var sub: String
    }

    /// The operator tools over the configured Redis store; the memory store lives inside the
    /// running gateway.
    static func tools(_ path: String) throws -> OperatorTools {
        try onRedis(path) { configuration, logger in try OperatorTools(configuration: configuration, logger: logger) }
    }

    /// The configured Redis store alone (`migrate`, `check --transfer`).
    static func store(_ path: String) throws -> (CommandStore, GatewayConfiguration) {
        try onRedis(path) { configuration, logger in (try CommandStore.open(configuration, logger: logger), configuration) }
    }

    /// `make` over the configuration at `path`, which must name a Redis store; a start-up
    /// failure is printed with its key.
    private static func onRedis<T>(_ path: String, _ make: (GatewayConfiguration, Logger) throws -> T) throws -> T {
        guard let configuration = loadConfiguration(path, printWarnings: false)?.configuration else { throw ExitCode(1) }
        guard configuration.store.redisURL != nil else {
            printError("\(path): store.redis_url is not set: this command works on the Redis store; the memory store lives inside the running gateway (restarting it ends every session)")
            throw ExitCode(1)
        }
        var logger = makeLogger()
        logger.logLevel = .warning
        do {
            return try make(configuration, logger)
        } catch let failure as StartupFailure {
            printError("\(path):\(failure.problem(locations: [:]))")
            throw ExitCode(1)
        }
    }

    static func time(_ ms: Int64) -> String {
        let formatter = ISO8601DateFormatter()
        return formatter.string(from: Date(timeIntervalSince1970: TimeInterval(ms) / 1000))
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List a user's live sessions (never their cookies).")
        @OptionGroup var target: Target

        func run() async throws {
            defer { flushLogs() }
            let tools = try SessionsCommand.tools(target.options.config)
            do {
                let sessions = try await tools.sessions(of: target.sub)
                await tools.close()
                if sessions.isEmpty { print("no live sessions for \(target.sub)"); return }
                print("SESSION       CREATED               LAST SEEN             CLIENT")
                for s in sessions {
                    print("\(s.handle.description)  \(SessionsCommand.time(s.created))  \(SessionsCommand.time(s.lastSeen))  \(s.clientID)")
                }
            } catch {
                await tools.close()
                printError("\(error)")
                throw ExitCode(1)
            }
        }
    }

    struct Revoke: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "End every session of a user now; sessions created before this moment are dead.",
            discussion: """
                The same revocation a running gateway makes: running gateways drop the user from their local caches at once when they listen for invalidations (within store.local_cache_ttl otherwise), and the app is told user.revoked with reason "operator" (events.url). The command reads the same files serve reads.
                --at-apple queues every refresh token the store holds for the user for revocation at Apple; the running gateways revoke them within seconds and retry until Apple answers (sessiongate_outbox_pending{kind="apple_revoke"}).
                --forget is a deletion request: it also deletes everything the store holds of the user (profile, stored tokens, link to a legacy account), and the app is told user.deleted instead; only the revocation marker remains, until the absolute session timeout. Without it, what the revocation leaves expires with that marker unless the user signs in again.
                """)
        @OptionGroup var target: Target
        @Flag(name: .long, help: "Also revoke the user's refresh tokens at Apple (queued for the running gateways).")
        var atApple = false
        @Flag(name: .long, help: "Also delete the user's profile and stored refresh tokens.")
        var forget = false

        func run() async throws {
            defer { flushLogs() }
            let tools = try SessionsCommand.tools(target.options.config)
            do {
                let (count, queued) = try await tools.revoke(target.sub, queueAtApple: atApple, forget: forget)
                await tools.close()
                print("revoked \(target.sub): \(count) session\(count == 1 ? "" : "s") ended" + (forget ? "; profile, stored tokens and link deleted" : ""))
                if atApple { print("\(queued) refresh token\(queued == 1 ? "" : "s") queued for revocation at Apple (the running gateways revoke them)") }
            } catch {
                await tools.close()
                printError("\(error)")
                throw ExitCode(1)
            }
        }
    }
}
