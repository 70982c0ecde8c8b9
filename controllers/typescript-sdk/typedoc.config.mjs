// API docs from the TSDoc comments: `npm run docs` writes dist/docs; `npm test` runs
// `npm run docs:check`, which fails on any warning (an undocumented export, a broken link).
import { OptionDefaults } from "typedoc";

/** @type {Partial<import("typedoc").TypeDocOptions>} */
export default {
  entryPoints: ["src/index.ts", "src/proto.ts"],
  tsconfig: "tsconfig.json",
  out: "dist/docs",
  name: "@ctrlhub/sdk",
  readme: "README.md",
  excludePrivate: true,
  excludeInternal: true,
  treatWarningsAsErrors: true,
  // No "Defined in" links: they would need a git remote, which a clone without one (CI's
  // checkout) lacks, and a warning there fails the check.
  disableSources: true,
  // protoc-gen-es marks what it generated with @generated.
  blockTags: [...OptionDefaults.blockTags, "@generated"],
  validation: { notExported: true, invalidLink: true, notDocumented: false },
};
