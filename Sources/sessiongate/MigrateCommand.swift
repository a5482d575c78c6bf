import ArgumentParser
import Foundation
import Gateway
import Logging

/// `sessiongate migrate`: an app transfer between teams (TN3159; README "Existing accounts and app transfers").
struct MigrateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "migrate",
        abstract: "Move Sign in with Apple users across an app transfer between teams (sessiongate check --transfer prints the checklist).",
        subcommands: [Export.self, Import.self])

    struct Pace: ParsableArguments {
        @Option(name: .long, help: "Calls to Apple per second at most.")
        var rate: Double = 10
        @Option(name: .long, help: "The client id to authenticate as (default: the first of apple.client_ids).")
        var clientID: String?
    }

    /// Runs `body` with a migration against the configured Redis store. With `events` (and an
    /// `events:` section), users it maps are announced to the app (`user.transferred`) as a
    /// running gateway announces them, through the operator tools' core (which reads every file
    /// `serve` reads); their first attempt is made before this returns.
    static func run(_ options: ConfigOption, _ pace: Pace, events: Bool = false, _ body: (Migration) async throws -> Void) async throws {
        let (store, configuration) = try SessionsCommand.store(options.config)
        let tools: OperatorTools?
        do {
            tools = events && configuration.events.isEnabled ? try SessionsCommand.tools(options.config) : nil
        } catch {
            await store.shutdown()
            throw error
        }
        var logger = makeLogger()
        logger.logLevel = .warning
        do {
            try await store.migration(configuration: configuration, clientID: pace.clientID, perSecond: pace.rate, logger: logger,
                                      transferred: { user in tools?.transferred(user) }, body)
        } catch {
            await tools?.close()
            await store.shutdown()
            if let exit = error as? ExitCode { throw exit }
            printError("\(error)")
            throw ExitCode(1)
        }
        await tools?.close()
        await store.shutdown()
    }

    struct Export: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "The sending team: write every user's transfer id for the recipient team, with their link, name and allow-list routes, to a JSON Lines file.",
            discussion: """
                Run it with the sending team's configuration (its apple: key), before the transfer or within the 60 days after.
                The file names users by transfer id only, never by their sub or private relay address (TN3159). Beside it, FILE.mapping.jsonl
                (mode 0600) maps each of your users' sub to their transfer id: re-key your own data export with it, and never give it to
                the recipient. Transfer ids are good for one team: a file made for one --target is never extended with another's (use
                another --out), and the ids the store holds for one team are not reused for another. Running it again resumes: users
                already in the file are skipped, and transfer ids the store already holds for the target are not asked for again.
                Exit status 2 when some users could not be exported yet (run again).
                """)
        @OptionGroup var options: ConfigOption
        @Option(name: .long, help: "The recipient's Team ID.")
        var target: String
        @Option(name: .long, help: "The file to write (appended to when it exists).")
        var out: String = "transfer.jsonl"
        @OptionGroup var pace: Pace

        func run() async throws {
            defer { flushLogs() }
            try await MigrateCommand.run(options, pace) { migration in
                let report = try await migration.export(target: target, to: out)
                for line in report.summary(file: out) { print(line) }
                if !report.failed.isEmpty { throw ExitCode(2) }
            }
        }
    }

    struct Import: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "The recipient team: exchange each transfer id of an export file for the user's sub here, and move their profile, link and allow-list entries to it.",
            discussion: """
                Run it with the recipient's configuration (its apple: key) within the 60 days after the transfer. Every line is loaded
                into the store first, so that a user the batch does not reach is mapped at their next sign-in. The old identities'
                sessions end (their refresh tokens belong to the old team). Prints the allow.users entries the configuration should have.
                Each user mapped is announced to the app as user.transferred (events.url), as at a sign-in. Running it again resumes:
                mapped users are skipped. Exit status: 0 every user mapped; 2 some not mapped yet (Apple or the store did not answer:
                run again); 3 Apple refused some transfer ids (consent revoked, another team's ids, or after day 60): those users are
                left behind, listed by transfer id; running again will not move them.
                """)
        @OptionGroup var options: ConfigOption
        @Argument(help: "The export file (JSON Lines).")
        var file: String
        @OptionGroup var pace: Pace

        func run() async throws {
            defer { flushLogs() }
            try await MigrateCommand.run(options, pace, events: true) { migration in
                let report = try await migration.importFile(file)
                for line in report.summary { print(line) }
                if report.exitStatus != 0 { throw ExitCode(report.exitStatus) }
            }
        }
    }
}
