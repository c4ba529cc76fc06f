// Where the tests find their files, from dist/test/ (compiled) back in the package and the
// Rhumbatron checkout around it (TS_WRITER_SCHEMAS points at another schemas folder).
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { defaultSchemasDir } from "../src/schemas.js";

const here = dirname(fileURLToPath(import.meta.url));

export const PACKAGE = resolve(here, "..", "..");
export const SCHEMAS = defaultSchemasDir();
